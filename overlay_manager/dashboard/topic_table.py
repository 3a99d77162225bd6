"""The dashboard's Topics view: one row per ROS topic connection between two machines (from the
selected node's ~topic_links), with the overlay path it crosses in the path's colour, under a
headline that counts the links by path.

:class:`TopicTable` drives the ``topic_table`` QTableWidget and ``topics_label`` of the widget's
.ui file, on the GUI thread; what each cell says comes from the pure ``topics`` module.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from python_qt_binding.QtCore import Qt
from python_qt_binding.QtGui import QBrush, QColor
from python_qt_binding.QtWidgets import QLabel, QTableWidget

from overlay_manager.dashboard import format as fmt
from overlay_manager.dashboard import topics as tv
from overlay_manager.dashboard.cells import (
    PathDelegate,
    background_name,
    cell_texts,
    item,
    paint_path_cell,
    set_headers,
)

TOPIC_KEYS = tuple(c[0] for c in tv.TOPIC_COLUMNS)
TCOL = {key: i for i, key in enumerate(TOPIC_KEYS)}
NO_LINKS_TEXT = "no ROS topic connection crosses machines (or none is known yet)"


class TopicTable:
    """The Topics view's table and headline."""

    def __init__(self, table: QTableWidget, label: QLabel) -> None:
        """Set up ``table``'s columns (sorted by topic); ``label`` is the headline above it."""
        self.table = table
        self.label = label
        set_headers(table, tv.TOPIC_COLUMNS)
        table.sortItems(TCOL["topic"], Qt.AscendingOrder)
        self._path_delegate = PathDelegate(table)
        table.setItemDelegateForColumn(TCOL["path"], self._path_delegate)
        for key, width in (("topic", 220), ("from", 100), ("to", 100), ("path", 80), ("where", 140)):
            table.setColumnWidth(TCOL[key], width)

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
            }
            tint = QBrush(QColor(fmt.path_tint(r.path)))
            for key, it in items.items():
                it.setBackground(tint)
                t.setItem(i, TCOL[key], it)
            paint_path_cell(items["path"], r.path)
            items["rate"].setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
        t.setSortingEnabled(True)
        self.label.setText(tv.topics_headline(rows) if rows else NO_LINKS_TEXT)

    def clear(self, headline: str) -> None:
        """No rows; ``headline`` says what the view waits for."""
        self.table.setRowCount(0)
        self.label.setText(headline)

    def rows(self) -> List[Dict[str, str]]:
        """The view as plain data: cell texts by column key plus the path cell's colour
        (``path_colour``)."""
        t = self.table
        out = []
        for row in range(t.rowCount()):
            cells = cell_texts(t, TOPIC_KEYS, TCOL, row)
            cells["path_colour"] = background_name(t.item(row, TCOL["path"]))
            out.append(cells)
        return out
