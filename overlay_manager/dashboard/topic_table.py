"""The dashboard's Topics view: one row per ROS topic connection between two machines (from the
selected node's ~topic_links), with the overlay path it crosses in the path's colour and, for a
shaped stream, what its subscriber gets (tier, rate cap, budget), under a headline that counts the
links by path.

:class:`TopicTable` drives the ``topic_table`` QTableWidget and ``topics_label`` of the widget's
.ui file, on the GUI thread; what each cell says comes from the pure ``topics`` module.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from python_qt_binding.QtCore import Qt
from python_qt_binding.QtWidgets import QLabel, QTableWidget

from overlay_manager.dashboard.cells import PathTable, item
from overlay_manager.view import text as fmt
from overlay_manager.view import topics as tv

TOPIC_KEYS = tuple(c[0] for c in tv.TOPIC_COLUMNS)
TCOL = {key: i for i, key in enumerate(TOPIC_KEYS)}
NO_LINKS_TEXT = "no ROS topic connection crosses machines (or none is known yet)"


class TopicTable(PathTable):
    """The Topics view's table and headline."""

    def __init__(self, table: QTableWidget, label: QLabel) -> None:
        """Set up ``table``'s columns (sorted by topic); ``label`` is the headline above it."""
        super().__init__(table, tv.TOPIC_COLUMNS, "topic",
                         (("topic", 340), ("from", 100), ("to", 100), ("path", 80), ("where", 140),
                          ("rate", 90), ("tier", 130), ("cap", 80)))
        self.label = label

    def fill(self, links: Sequence[Any]) -> None:
        """One row per TopicLink message that crosses machines, and the headline counting them."""
        rows = tv.topic_rows(links)
        t = self.table
        t.setSortingEnabled(False)
        t.setRowCount(len(rows))
        for i, r in enumerate(rows):
            items = {
                "topic": item(r.topic, tooltip=r.topic_tip),
                "from": item(r.sender, tooltip=r.sender_tip),
                "to": item(r.receiver, tooltip=r.receiver_tip),
                "path": item(r.path, tooltip=fmt.path_description(r.path)),
                "where": item(r.where),
                "rate": item(r.rate, r.rate_sort),
                "tier": item(r.shaping.tier, tooltip=r.shaping.tier_tip),
                "cap": item(r.shaping.cap, r.shaping.cap_sort),
                "budget": item(r.shaping.budget, r.shaping.budget_sort),
            }
            self.put_row(i, items, r.path)
            for key in ("rate", "cap"):  # the budget is the last column, stretched: left as text
                items[key].setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
        t.setSortingEnabled(True)
        self.label.setText(tv.topics_headline(rows) if rows else NO_LINKS_TEXT)

    def clear(self, headline: str) -> None:
        """No rows; ``headline`` says what the view waits for."""
        self.table.setRowCount(0)
        self.label.setText(headline)

    def rows(self) -> List[Dict[str, str]]:
        """The view as plain data: cell texts by column key plus the path cell's colour
        (``path_colour``)."""
        return [self.row_texts(row) for row in range(self.table.rowCount())]
