"""The dashboard's view: peer table, Topics view, this machine's state, history plot, path-change
log, actions; a node that stops publishing is marked stale.

The layout comes from ``resource/overlay_dashboard.ui``. The widget reads nothing from ROS itself:
it shows what the model signals (over queued connections, so slots run on the GUI thread) and asks
the model to act. ``save_state``/``restore_state`` give the settings as a dict of strings, which
the rqt plugin and the standalone window store in their own settings objects.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from python_qt_binding import loadUi
from python_qt_binding.QtCore import QPoint, Qt, QTimer
from python_qt_binding.QtGui import QBrush, QColor, QPen
from python_qt_binding.QtWidgets import (
    QAction,
    QHeaderView,
    QListWidgetItem,
    QMenu,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidgetItem,
    QWidget,
)

from overlay_manager.dashboard import format as fmt
from overlay_manager.dashboard import topics as tv
from overlay_manager.dashboard.model import ActionResult, OverlayModel
from overlay_manager.dashboard.plot import HistoryPlot
from overlay_manager.dashboard.state import DEFAULT_NODE, normalise_node

UI_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resource", "overlay_dashboard.ui")

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
TOPIC_KEYS = tuple(c[0] for c in tv.TOPIC_COLUMNS)
TCOL = {key: i for i, key in enumerate(TOPIC_KEYS)}
STALE_FOREGROUND = "#9e9e9e"   # text of every cell while the node is stale
STALE_BACKGROUND = "#eeeeee"   # background of every cell (path cells too) while the node is stale

SETTING_NODE = "node"
SETTING_HIDDEN = "hidden_columns"
SETTING_SORT_COLUMN = "sort_column"
SETTING_SORT_ORDER = "sort_order"
SETTING_KEYS = (SETTING_NODE, SETTING_HIDDEN, SETTING_SORT_COLUMN, SETTING_SORT_ORDER)
PATH_LOG_MAX = 500
SORT_ROLE = Qt.UserRole + 1


class _Item(QTableWidgetItem):
    """Table item that sorts by a key stored under SORT_ROLE (numbers sort as numbers)."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        a, b = self.data(SORT_ROLE), other.data(SORT_ROLE)
        if a is None or b is None or type(a) is not type(b):
            return super().__lt__(other)
        return a < b


class _PathDelegate(QStyledItemDelegate):
    """Paints the path cell in its path colour even when its row is selected (the selection
    highlight would hide the colour, the one thing the column is for); a frame in the highlight
    colour marks the selection instead."""

    def paint(self, painter: Any, option: Any, index: Any) -> None:  # noqa: D102 (Qt override)
        selected = bool(option.state & QStyle.State_Selected)
        if not selected:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        opt.state = opt.state & ~QStyle.State_Selected
        super().paint(painter, opt, index)
        painter.save()
        pen = QPen(option.palette.highlight().color())
        pen.setWidth(2)
        painter.setPen(pen)
        painter.drawRect(option.rect.adjusted(1, 1, -1, -1))
        painter.restore()


def _item(text: str, sort_key: Any = None, tooltip: str = "") -> _Item:
    item = _Item(text)
    item.setData(SORT_ROLE, text.lower() if sort_key is None else sort_key)
    if tooltip:
        item.setToolTip(tooltip)
    return item


def _coloured(text: str, level: str) -> str:
    """Rich text in a level's colour (labels)."""
    colour = fmt.LEVEL_COLOURS.get(level, fmt.LEVEL_COLOURS[fmt.LEVEL_UNKNOWN])
    return f'<span style="color:{colour}">{_escape(text)}</span>'


def _plain(text: str) -> str:
    """A label's text without the markup of _coloured."""
    return re.sub(r"<[^>]*>", "", text).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class OverlayDashboardWidget(QWidget):
    """The dashboard view for the node the model has selected."""

    def __init__(self, model: OverlayModel, parent: Optional[QWidget] = None) -> None:
        """Load the .ui, connect the model's signals (queued) and the widgets' own signals."""
        super().__init__(parent)
        loadUi(UI_FILE, self)
        self.setObjectName("OverlayDashboardWidget")
        self._model = model
        self._peers: Dict[str, Any] = {}          # name -> Peer message from the last PeerList
        self._handshakes: Dict[str, float] = {}   # name -> last handshake (POSIX s)
        self._status: Any = None
        self._user_picked_node = False
        self._busy: Dict[str, str] = {}           # peer -> running action
        self._stale = False                       # the rows are greyed out as stale
        self._peers_stale = False                 # the last ~peers said the node's view is stale
        self._headline = ""                       # the headline while the node is fresh
        self._links: Any = None                   # the last TopicLinkList (repainted after stale)

        self.plot = HistoryPlot(self.plot_container)
        self.plot_layout.addWidget(self.plot)
        self._setup_table()
        self._setup_topic_table()
        self._setup_columns_menu()
        # the peer table (and Topics) get most of the window; this machine's state has its own
        # tab; the selected-peer/log pane below keeps a small share (splitter handle to resize)
        self.main_splitter.setStretchFactor(0, 4)
        self.main_splitter.setStretchFactor(1, 1)
        self.main_splitter.setChildrenCollapsible(False)
        self.main_splitter.setSizes([560, 170])
        self.peer_table.setMinimumHeight(110)
        self.plot.setMinimumHeight(60)
        self.result_text.setMaximumHeight(4 * self.result_text.fontMetrics().height())
        self.result_text.setMinimumHeight(2 * self.result_text.fontMetrics().height())
        self.bottom_splitter.setStretchFactor(0, 3)
        self.bottom_splitter.setStretchFactor(1, 2)
        # long texts (NAT, health, ROS) may be cut in a narrow window; their tooltips keep all of it
        for label in (self.nat_value, self.health_value, self.ros_value, self.self_value):
            label.setMinimumWidth(1)

        q = Qt.QueuedConnection
        model.nodes_changed.connect(self._on_nodes, q)
        model.node_changed.connect(self._on_node_changed, q)
        model.peers_received.connect(self._on_peers, q)
        model.status_received.connect(self._on_status, q)
        model.path_change_received.connect(self._on_path_change, q)
        model.topic_links_received.connect(self._on_topic_links, q)
        model.action_started.connect(self._on_action_started, q)
        model.action_finished.connect(self._on_action_finished, q)
        model.error.connect(self._on_error, q)

        self.node_combo.activated[str].connect(self._on_node_picked)
        self.refresh_button.clicked.connect(model.refresh_nodes)
        self.peer_table.itemSelectionChanged.connect(self._on_selection)
        self.ping_button.clicked.connect(self.ping_selected)
        self.measure_button.clicked.connect(self.measure_selected)
        self.wait_button.clicked.connect(self.wait_selected)
        self._update_buttons()

        self._tick = QTimer(self)  # ages and the plot move with the clock
        self._tick.setInterval(1000)
        self._tick.timeout.connect(self._on_tick)
        self._tick.start()

    # ------------------------------------------------------------------ setup
    def _setup_table(self) -> None:
        t = self.peer_table
        t.setColumnCount(len(COLUMNS))
        for i, (_, header, tip) in enumerate(COLUMNS):
            item = QTableWidgetItem(header)
            item.setToolTip(tip)
            t.setHorizontalHeaderItem(i, item)
        hh = t.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.Interactive)
        hh.setContextMenuPolicy(Qt.CustomContextMenu)
        hh.customContextMenuRequested.connect(self._on_header_menu)
        t.sortItems(COL["name"], Qt.AscendingOrder)
        t.verticalHeader().setDefaultSectionSize(t.fontMetrics().height() + 8)
        self._path_delegate = _PathDelegate(t)
        t.setItemDelegateForColumn(COL["path"], self._path_delegate)
        # fits rqt's default plugin width without horizontal scrolling (the last column stretches)
        for key, width in (("name", 90), ("address", 95), ("online", 50), ("path", 75),
                           ("where", 125), ("latency", 65), ("rx", 82), ("tx", 82)):
            t.setColumnWidth(COL[key], width)

    def _setup_topic_table(self) -> None:
        t = self.topic_table
        t.setColumnCount(len(tv.TOPIC_COLUMNS))
        for i, (_, header, tip) in enumerate(tv.TOPIC_COLUMNS):
            item = QTableWidgetItem(header)
            item.setToolTip(tip)
            t.setHorizontalHeaderItem(i, item)
        t.horizontalHeader().setSectionResizeMode(QHeaderView.Interactive)
        t.sortItems(TCOL["topic"], Qt.AscendingOrder)
        t.verticalHeader().setDefaultSectionSize(t.fontMetrics().height() + 8)
        self._topic_path_delegate = _PathDelegate(t)
        t.setItemDelegateForColumn(TCOL["path"], self._topic_path_delegate)
        for key, width in (("topic", 220), ("from", 100), ("to", 100), ("path", 80), ("where", 140)):
            t.setColumnWidth(TCOL[key], width)

    def _setup_columns_menu(self) -> None:
        self._columns_menu = QMenu(self)
        self._column_actions: Dict[str, QAction] = {}
        for key, header, _ in COLUMNS:
            action = QAction(header, self._columns_menu)
            action.setCheckable(True)
            action.setChecked(True)
            action.setEnabled(key != "name")  # the name column identifies the row
            action.toggled.connect(lambda on, k=key: self.set_column_visible(k, on))
            self._columns_menu.addAction(action)
            self._column_actions[key] = action
        self.columns_button.setMenu(self._columns_menu)

    def _on_header_menu(self, pos: QPoint) -> None:
        self._columns_menu.exec_(self.peer_table.horizontalHeader().mapToGlobal(pos))

    # ------------------------------------------------------------------ columns and settings
    def set_column_visible(self, key: str, visible: bool) -> None:
        """Show or hide a peer-table column by key (see COLUMNS)."""
        if key == "name" or key not in COL:
            return
        self.peer_table.setColumnHidden(COL[key], not visible)
        action = self._column_actions[key]
        if action.isChecked() != visible:
            action.setChecked(visible)

    def hidden_columns(self) -> List[str]:
        """Keys of the hidden peer-table columns."""
        return [k for k in COLUMN_KEYS if self.peer_table.isColumnHidden(COL[k])]

    def save_state(self) -> Dict[str, str]:
        """Settings as strings: selected node, hidden columns, sort column and order."""
        hh = self.peer_table.horizontalHeader()
        column = hh.sortIndicatorSection()
        return {
            SETTING_NODE: self._model.node(),
            SETTING_HIDDEN: ",".join(self.hidden_columns()),
            SETTING_SORT_COLUMN: COLUMN_KEYS[column] if 0 <= column < len(COLUMN_KEYS) else "name",
            SETTING_SORT_ORDER: "desc" if hh.sortIndicatorOrder() == Qt.DescendingOrder else "asc",
        }

    def restore_state(self, state: Mapping[str, Any]) -> None:
        """Apply settings from save_state (missing or unknown values keep the defaults)."""
        hidden = set(fmt.split_csv(state.get(SETTING_HIDDEN)))
        for key in COLUMN_KEYS:
            self.set_column_visible(key, key not in hidden)
        column = str(state.get(SETTING_SORT_COLUMN) or "name")
        order = Qt.DescendingOrder if str(state.get(SETTING_SORT_ORDER)) == "desc" else Qt.AscendingOrder
        self.peer_table.sortItems(COL.get(column, COL["name"]), order)
        node = normalise_node(str(state.get(SETTING_NODE) or ""))
        if node:
            self.select_node(node, user=True)

    # ------------------------------------------------------------------ node selection
    def start(self, node: str = "") -> None:
        """Select a node (default /overlay_manager until discovery finds others) and start looking."""
        if not self._model.node():
            self.select_node(node or DEFAULT_NODE, user=bool(node))
        self._model.start()

    def select_node(self, node: str, user: bool = False) -> None:
        """Show a node; user=True keeps it even when discovery finds other nodes."""
        node = normalise_node(node)
        if not node:
            return
        self._user_picked_node = self._user_picked_node or user
        if self.node_combo.findText(node) < 0:
            self.node_combo.addItem(node)
        self.node_combo.setCurrentText(node)
        self._model.set_node(node)

    def _on_node_picked(self, text: str) -> None:
        self.select_node(text, user=True)

    def _on_nodes(self, nodes: List[str]) -> None:
        current = self._model.node()
        self.node_combo.blockSignals(True)
        self.node_combo.clear()
        self.node_combo.addItems(nodes)
        if current and current not in nodes:
            self.node_combo.addItem(current)
        self.node_combo.setCurrentText(current)
        self.node_combo.blockSignals(False)
        if nodes and current not in nodes and not self._user_picked_node:
            self.select_node(nodes[0])

    def _on_node_changed(self, node: str) -> None:
        self._peers.clear()
        self._handshakes.clear()
        self._status = None
        self._stale = False
        self._peers_stale = False
        self._links = None
        self.peer_table.setRowCount(0)
        self.topic_table.setRowCount(0)
        self.topics_label.setText(f"waiting for {node}/topic_links" if node else "no node selected")
        self.path_log.clear()
        for name in ("state_value", "self_value", "nat_value", "control_value", "ros_value",
                     "health_value"):
            getattr(self, name).setText("-")
        self._set_headline(f"waiting for {node}/peers" if node else "no node selected")
        self._on_selection()

    # ------------------------------------------------------------------ model data
    def _on_peers(self, msg: Any) -> None:
        selected = self.selected_peer()
        self._peers = {p.name: p for p in msg.peers}
        t = self.peer_table
        t.setSortingEnabled(False)
        t.setRowCount(len(msg.peers))
        for row, peer in enumerate(msg.peers):
            self._fill_row(row, peer)
        t.setSortingEnabled(True)  # re-sorts by the current indicator
        if selected:
            self._select_row_of(selected)
        self._peers_stale = bool(getattr(msg, "stale", False))
        if self._stale:
            self._stale = False
            if self._links is not None:
                self._on_topic_links(self._links)
        self._set_headline(fmt.peer_counts(msg.peers))
        self._check_stale()
        self._update_selected_panel()

    def _fill_row(self, row: int, peer: Any) -> None:
        rx, tx = self._model.rates(peer.name)
        handshake = peer.last_handshake.to_sec()
        self._handshakes[peer.name] = handshake
        address = peer.addresses[0] if peer.addresses else ""
        latency = peer.latency_ms
        items = {
            "name": _item(peer.name, tooltip=peer.dns_name),
            "address": _item(address, tooltip="\n".join([peer.dns_name, *peer.addresses])),
            "online": _item("yes" if peer.online else "no", int(peer.online)),
            "path": _item(peer.path, tooltip=fmt.path_description(peer.path)),
            "where": _item(fmt.peer_where(peer)),
            "latency": _item(fmt.format_latency(latency), -1.0 if fmt.is_nan(latency) else latency),
            "rx": _item(fmt.format_rate(rx), -1.0 if rx is None else rx),
            "tx": _item(fmt.format_rate(tx), -1.0 if tx is None else tx),
            "handshake": _item(fmt.format_age(handshake), handshake,
                               tooltip=fmt.format_clock(handshake)),
        }
        tint = QBrush(QColor(fmt.path_tint(peer.path)))
        for key, item in items.items():
            item.setBackground(tint)
            if not peer.online:
                item.setForeground(QBrush(QColor("#757575")))
            self.peer_table.setItem(row, COL[key], item)
        path_item = items["path"]
        path_item.setBackground(QBrush(QColor(fmt.path_colour(peer.path))))
        path_item.setForeground(QBrush(QColor("#ffffff")))
        path_item.setTextAlignment(Qt.AlignCenter)
        for key in ("latency", "rx", "tx"):
            items[key].setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)

    def _on_status(self, msg: Any) -> None:
        self._status = msg
        if getattr(msg, "stale", False) or self._stale:
            self._check_stale()  # the reason it gives replaces the headline at once
        verdict = fmt.overlay_verdict(msg)
        self.state_value.setText(_coloured(f"{verdict.text} (tailscaled {msg.backend_state or '-'}"
                                           f", {msg.tailscale_version or 'version unknown'})",
                                           verdict.level))
        addresses = ", ".join(msg.self_addresses) or "no overlay address"
        self.self_value.setText(f"{msg.self_name or '-'}  {msg.self_dns_name}  ({addresses})")
        nat = fmt.nat_verdict(msg.nat)
        self.nat_value.setText(_coloured(nat.text, nat.level))
        self.nat_value.setToolTip(nat.text + (f"\nnode's summary: {msg.nat.summary}" if msg.nat.summary else ""))
        control = "reachable" if msg.control_reachable else "not reachable"
        self.control_value.setText(_coloured(f"{msg.login_server or '-'}: {control}",
                                             fmt.LEVEL_OK if msg.control_reachable else fmt.LEVEL_WARN))
        self.ros_value.setText(f"ROS_MASTER_URI={msg.ros_master_uri or '-'}  "
                               f"ROS_HOSTNAME={msg.ros_hostname or '-'}")
        self.ros_value.setToolTip(self.ros_value.text())
        self.health_value.setText(_coloured("; ".join(msg.health), fmt.LEVEL_WARN)
                                  if msg.health else _coloured("no warnings", fmt.LEVEL_OK))
        self.health_value.setToolTip("\n".join(msg.health))

    def _on_topic_links(self, msg: Any) -> None:
        self._links = msg
        rows = tv.topic_rows(msg.links)
        t = self.topic_table
        t.setSortingEnabled(False)
        t.setRowCount(len(rows))
        for i, r in enumerate(rows):
            items = {
                "topic": _item(r.topic, tooltip=r.topic_tip),
                "from": _item(r.sender, tooltip=r.sender_tip),
                "to": _item(r.receiver, tooltip=r.receiver_tip),
                "path": _item(r.path, tooltip=fmt.path_description(r.path)),
                "where": _item(r.where),
                "rate": _item(r.rate, r.rate_sort),
            }
            tint = QBrush(QColor(fmt.path_tint(r.path)))
            for key, item in items.items():
                item.setBackground(tint)
                t.setItem(i, TCOL[key], item)
            items["path"].setBackground(QBrush(QColor(fmt.path_colour(r.path))))
            items["path"].setForeground(QBrush(QColor("#ffffff")))
            items["path"].setTextAlignment(Qt.AlignCenter)
            items["rate"].setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
        t.setSortingEnabled(True)
        self.topics_label.setText(tv.topics_headline(rows) if rows else
                                  "no ROS topic connection crosses machines (or none is known yet)")

    def _on_path_change(self, msg: Any) -> None:
        item = QListWidgetItem(fmt.path_change_text(msg))
        item.setForeground(QBrush(QColor(fmt.path_colour(msg.new_path))))
        item.setToolTip(f"{msg.dns_name}: {fmt.path_description(msg.new_path)}")
        self.path_log.insertItem(0, item)
        while self.path_log.count() > PATH_LOG_MAX:
            self.path_log.takeItem(self.path_log.count() - 1)

    # ------------------------------------------------------------------ selection and plot
    def selected_peer(self) -> str:
        """Name of the selected peer ("" = none)."""
        rows = self.peer_table.selectionModel().selectedRows(COL["name"])
        return rows[0].data() if rows else ""

    def select_peer(self, name: str) -> bool:
        """Select a peer's row by name; False when it is not in the table."""
        return self._select_row_of(name)

    def row_of(self, name: str) -> int:
        """Row index of a peer in the table (-1 = not shown)."""
        for row in range(self.peer_table.rowCount()):
            item = self.peer_table.item(row, COL["name"])
            if item is not None and item.text() == name:
                return row
        return -1

    def _select_row_of(self, name: str) -> bool:
        row = self.row_of(name)
        if row < 0:
            return False
        self.peer_table.selectRow(row)
        return True

    def _on_selection(self) -> None:
        self._update_selected_panel()
        self._update_buttons()

    def _update_selected_panel(self) -> None:
        name = self.selected_peer()
        peer = self._peers.get(name)
        if not name or peer is None:
            self.selected_value.setText("select a peer in the table")
            self.plot.set_samples("", [])
            return
        where = fmt.peer_where(peer)
        busy = f" - {self._busy[name]} running" if name in self._busy else ""
        self.selected_value.setText(
            f"{peer.dns_name or name}: {peer.path}{f' ({where})' if where else ''}, "
            f"latency {fmt.format_latency(peer.latency_ms)}{busy}")
        self.plot.set_samples(name, self._model.history(name))

    def _set_headline(self, text: str) -> None:
        """The headline while the node is fresh (a stale node's warning replaces it on the tick)."""
        self._headline = text
        if not self._stale:
            self.headline_label.setText(text)

    def _stale_reason(self) -> str:
        """Why the shown state is stale ("" = it is not): the node stopped publishing (a dead
        node's latched ~peers would otherwise stay green), or it says it cannot read tailscaled."""
        node = self._model.node()
        age = self._model.stale_for()
        if age is not None:
            return tv.stale_text(node, age, self._model.stale_after())
        st = self._status
        if self._peers_stale or (st is not None and getattr(st, "stale", False)):
            return tv.reported_stale_text(node, getattr(st, "status_age", None), getattr(st, "error", ""))
        return ""

    def _check_stale(self) -> None:
        """Grey out the tables and say why while the state is stale; the next fresh ~peers
        message restores the colours."""
        reason = self._stale_reason()
        if not reason:  # fresh (or ~status came back first: the grey stays until ~peers refills)
            return
        self._stale = True
        self.headline_label.setText(_coloured(reason, fmt.LEVEL_ERROR))
        grey, back = QBrush(QColor(STALE_FOREGROUND)), QBrush(QColor(STALE_BACKGROUND))
        for table in (self.peer_table, self.topic_table):
            for row in range(table.rowCount()):
                for column in range(table.columnCount()):
                    item = table.item(row, column)
                    if item is not None:
                        item.setForeground(grey)
                        item.setBackground(back)

    def _on_tick(self) -> None:
        self._check_stale()
        now = time.time()
        column = COL["handshake"]
        for row in range(self.peer_table.rowCount()):
            name_item = self.peer_table.item(row, COL["name"])
            item = self.peer_table.item(row, column)
            if name_item is not None and item is not None:
                item.setText(fmt.format_age(self._handshakes.get(name_item.text(), 0.0), now))
        self._update_selected_panel()

    # ------------------------------------------------------------------ actions
    def _update_buttons(self) -> None:
        enabled = bool(self.selected_peer())
        for button in (self.ping_button, self.measure_button, self.wait_button):
            button.setEnabled(enabled)

    def ping_selected(self) -> None:
        """Ping the selected peer (result appears in the result box)."""
        if self.selected_peer():
            self._model.ping(self.selected_peer())

    def measure_selected(self) -> None:
        """Measure the link to the selected peer with iperf3."""
        if self.selected_peer():
            self._model.measure_link(self.selected_peer())

    def wait_selected(self) -> None:
        """Wait until the link to the selected peer is direct."""
        if self.selected_peer():
            self._model.wait_for_direct(self.selected_peer())

    def _on_action_started(self, action: str, peer: str) -> None:
        self._busy[peer] = action
        self._append_result(f"{action} {peer}: running ...", fmt.LEVEL_UNKNOWN)
        self._update_selected_panel()

    def _on_action_finished(self, result: ActionResult) -> None:
        self._busy.pop(result.peer, None)
        if result.node != self._model.node():
            return
        self._append_result(f"{result.verdict.text}  [{result.elapsed:.1f} s]", result.verdict.level)
        self._update_selected_panel()

    def _on_error(self, text: str) -> None:
        self.headline_label.setText(_coloured(text, fmt.LEVEL_ERROR))

    def _append_result(self, text: str, level: str) -> None:
        stamp = fmt.format_clock(time.time())
        self.result_text.appendHtml(_coloured(f"{stamp}  {text}", level))

    def last_result(self) -> str:
        """The newest line of the result box (tests and logs)."""
        lines = self.result_text.toPlainText().splitlines()
        return lines[-1] if lines else ""

    def snapshot(self) -> Dict[str, Any]:
        """What the view shows right now, as plain data (tests, logs): the selected node, headline,
        this machine's fields (plain text), the peer table (cell texts by column key plus the path
        cell's and the row's background colours), the path-change log (newest first), the last
        action result, whether the node is marked stale, and the Topics view."""
        t = self.peer_table
        rows = []
        for row in range(t.rowCount()):
            cells = {key: (t.item(row, COL[key]).text() if t.item(row, COL[key]) else "")
                     for key in COLUMN_KEYS}
            path_item, name_item = t.item(row, COL["path"]), t.item(row, COL["name"])
            cells["path_colour"] = path_item.background().color().name() if path_item else ""
            cells["row_tint"] = name_item.background().color().name() if name_item else ""
            rows.append(cells)
        fields = {name: _plain(getattr(self, f"{name}_value").text())
                  for name in ("state", "self", "nat", "control", "ros", "health", "selected")}
        return {
            "node": self._model.node(),
            "nodes": [self.node_combo.itemText(i) for i in range(self.node_combo.count())],
            "headline": _plain(self.headline_label.text()),
            "fields": fields,
            "nat_detail": self.nat_value.toolTip(),
            "rows": rows,
            "selected_peer": self.selected_peer(),
            "path_log": [self.path_log.item(i).text() for i in range(self.path_log.count())],
            "last_result": self.last_result(),
            "stale": self._stale,
            "topics_headline": _plain(self.topics_label.text()),
            "topics": self.topic_rows(),
        }

    def topic_rows(self) -> List[Dict[str, str]]:
        """The Topics view as plain data: cell texts by column key plus the path cell's colour."""
        t = self.topic_table
        rows = []
        for row in range(t.rowCount()):
            cells = {key: (t.item(row, TCOL[key]).text() if t.item(row, TCOL[key]) else "")
                     for key in TOPIC_KEYS}
            path_item = t.item(row, TCOL["path"])
            cells["path_colour"] = path_item.background().color().name() if path_item else ""
            rows.append(cells)
        return rows

    def shutdown(self) -> None:
        """Stop the clock (the model is shut down by its owner)."""
        self._tick.stop()
