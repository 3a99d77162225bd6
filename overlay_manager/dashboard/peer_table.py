"""The dashboard's peer table: one row per peer of the selected node's last ~peers message, the
row tinted by its path and the path cell in the path's colour; columns the user can hide (header
context menu or the Columns button) and sort.

:class:`PeerTable` drives the ``peer_table`` QTableWidget the widget's .ui file creates; it runs
on the GUI thread only and reads nothing from ROS (the widget hands it the messages).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from python_qt_binding.QtCore import QPoint, Qt
from python_qt_binding.QtWidgets import QAction, QMenu, QTableWidget, QToolButton, QWidget

from overlay_manager.dashboard.cells import PathTable, background_name, item
from overlay_manager.view import text as fmt

# (key, header, tooltip); keys are what the settings store.
COLUMNS: Tuple[Tuple[str, str, str], ...] = (
    ("name", "Name", "short name (hostname label)"),
    ("address", "Overlay IP", "first overlay IP address; the tooltip has the overlay name"),
    ("online", "Online", "the control server reports the peer connected"),
    ("path", "Path", "direct | peer-relay | derp (relayed) | idle (no traffic yet) | offline"),
    ("where", "Endpoint / relay", "UDP endpoint of a direct path, or the DERP region relaying it"),
    ("latency", "Latency", "last round trip measured through the overlay"),
    ("rx", "Rx", "receive rate from the peer, from tailscaled's byte counters"),
    ("tx", "Tx", "send rate to the peer, from tailscaled's byte counters"),
    ("handshake", "Last handshake", "last WireGuard handshake with the peer"),
)
COLUMN_KEYS = tuple(c[0] for c in COLUMNS)
COL = {key: i for i, key in enumerate(COLUMN_KEYS)}
OFFLINE_FOREGROUND = "#757575"  # text of an offline peer's row

#: peer name -> (rx, tx) rates in bytes/s (None = not known yet)
Rates = Callable[[str], Tuple[Optional[float], Optional[float]]]


class PeerTable(PathTable):
    """The peer table, its column menu and the handshake ages that move with the clock."""

    def __init__(self, table: QTableWidget, columns_button: QToolButton, parent: QWidget) -> None:
        """Set up ``table``'s columns (sorted by name) and the column menu of ``columns_button``
        and of the header's context menu (the menu belongs to ``parent``)."""
        # the widths fit rqt's default plugin width without horizontal scrolling (the last
        # column stretches)
        super().__init__(table, COLUMNS, "name", (("name", 90), ("address", 95), ("online", 50), ("path", 75),
                                                  ("where", 125), ("latency", 65), ("rx", 82), ("tx", 82)))
        self._handshakes: Dict[str, float] = {}   # name -> last handshake (POSIX s)
        hh = table.horizontalHeader()
        hh.setContextMenuPolicy(Qt.CustomContextMenu)
        hh.customContextMenuRequested.connect(self._on_header_menu)

        self._columns_menu = QMenu(parent)
        self._column_actions: Dict[str, QAction] = {}
        for key, header, _ in COLUMNS:
            action = QAction(header, self._columns_menu)
            action.setCheckable(True)
            action.setChecked(True)
            action.setEnabled(key != "name")  # the name column identifies the row
            action.toggled.connect(lambda on, k=key: self.set_column_visible(k, on))
            self._columns_menu.addAction(action)
            self._column_actions[key] = action
        columns_button.setMenu(self._columns_menu)

    def _on_header_menu(self, pos: QPoint) -> None:
        self._columns_menu.exec_(self.table.horizontalHeader().mapToGlobal(pos))

    # ------------------------------------------------------------------ columns and sorting
    def set_column_visible(self, key: str, visible: bool) -> None:
        """Show or hide a column by key (see COLUMNS); the name column always shows."""
        if key == "name" or key not in COL:
            return
        self.table.setColumnHidden(COL[key], not visible)
        action = self._column_actions[key]
        if action.isChecked() != visible:
            action.setChecked(visible)

    def hidden_columns(self) -> List[str]:
        """Keys of the hidden columns."""
        return [k for k in COLUMN_KEYS if self.table.isColumnHidden(COL[k])]

    def sort_setting(self) -> Tuple[str, str]:
        """(column key, "asc" or "desc") of the current sort ("name" if the column is unknown)."""
        hh = self.table.horizontalHeader()
        column = hh.sortIndicatorSection()
        return (COLUMN_KEYS[column] if 0 <= column < len(COLUMN_KEYS) else "name",
                "desc" if hh.sortIndicatorOrder() == Qt.DescendingOrder else "asc")

    def sort_by(self, key: str, descending: bool) -> None:
        """Sort by the column ``key`` (unknown keys sort by name)."""
        self.table.sortItems(COL.get(key, COL["name"]), Qt.DescendingOrder if descending else Qt.AscendingOrder)

    # ------------------------------------------------------------------ rows
    def fill(self, peers: Sequence[Any], rates: Rates) -> None:
        """One row per Peer message; the rows are re-sorted by the current sort column."""
        t = self.table
        t.setSortingEnabled(False)
        t.setRowCount(len(peers))
        for row, peer in enumerate(peers):
            self._fill_row(row, peer, rates)
        t.setSortingEnabled(True)  # re-sorts by the current indicator

    def _fill_row(self, row: int, peer: Any, rates: Rates) -> None:
        rx, tx = rates(peer.name)
        handshake = peer.last_handshake.to_sec()
        self._handshakes[peer.name] = handshake
        address = peer.addresses[0] if peer.addresses else ""
        latency = peer.latency_ms
        items = {
            "name": item(peer.name, tooltip=peer.dns_name),
            "address": item(address, tooltip="\n".join([peer.dns_name, *peer.addresses])),
            "online": item("yes" if peer.online else "no", int(peer.online)),
            "path": item(peer.path, tooltip=fmt.path_description(peer.path)),
            "where": item(fmt.peer_where(peer)),
            "latency": item(fmt.format_latency(latency), -1.0 if fmt.is_nan(latency) else latency),
            "rx": item(fmt.format_rate(rx), -1.0 if rx is None else rx),
            "tx": item(fmt.format_rate(tx), -1.0 if tx is None else tx),
            "handshake": item(fmt.format_age(handshake), handshake,
                              tooltip=fmt.format_clock(handshake)),
        }
        self.put_row(row, items, peer.path, "" if peer.online else OFFLINE_FOREGROUND)
        for key in ("latency", "rx", "tx"):
            items[key].setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)

    def clear(self) -> None:
        """No rows (another node was selected)."""
        self._handshakes.clear()
        self.table.setRowCount(0)

    def show_ages(self, now: Optional[float] = None) -> None:
        """Rewrite the handshake column's ages for ``now`` (POSIX s; default: the clock)."""
        now = time.time() if now is None else now
        column = COL["handshake"]
        for row in range(self.table.rowCount()):
            name_item = self.table.item(row, COL["name"])
            age_item = self.table.item(row, column)
            if name_item is not None and age_item is not None:
                age_item.setText(fmt.format_age(self._handshakes.get(name_item.text(), 0.0), now))

    # ------------------------------------------------------------------ selection
    def selected(self) -> str:
        """Name of the selected peer ("" = none)."""
        rows = self.table.selectionModel().selectedRows(COL["name"])
        return rows[0].data() if rows else ""

    def row_of(self, name: str) -> int:
        """Row index of a peer (-1 = not shown)."""
        for row in range(self.table.rowCount()):
            name_item = self.table.item(row, COL["name"])
            if name_item is not None and name_item.text() == name:
                return row
        return -1

    def select(self, name: str) -> bool:
        """Select a peer's row by name; False when it is not in the table."""
        row = self.row_of(name)
        if row < 0:
            return False
        self.table.selectRow(row)
        return True

    def rows(self) -> List[Dict[str, str]]:
        """The table as plain data: cell texts by column key plus the path cell's
        (``path_colour``) and the row's (``row_tint``) background colours."""
        out = []
        for row in range(self.table.rowCount()):
            cells = self.row_texts(row)
            cells["row_tint"] = background_name(self.table.item(row, COL["name"]))
            out.append(cells)
        return out
