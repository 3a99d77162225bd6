"""The dashboard's view: peer table, Topics view, this machine's state, history plot, path-change
log, actions; a node that stops publishing is marked stale.

The layout comes from ``resource/overlay_dashboard.ui``. The widget reads nothing from ROS itself:
it shows what the model signals (over queued connections, so slots run on the GUI thread) and asks
the model to act. ``save_state``/``restore_state`` give the settings as a dict of strings, which
the rqt plugin and the standalone window store in their own settings objects.

The widget owns what ties the parts together (the selected node, the stale mark, the selected
peer's panel, the actions and their result box); the parts have their own modules: the peer table
(``peer_table``), the Topics view (``topic_table``), the "This machine" panel (``status_panel``),
the history plot (``plot``) and the Qt pieces they share (``cells``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Mapping, Optional

from python_qt_binding import loadUi
from python_qt_binding.QtCore import Qt, QTimer
from python_qt_binding.QtGui import QBrush, QColor
from python_qt_binding.QtWidgets import QListWidgetItem, QWidget

from overlay_manager.dashboard.cells import (
    coloured,
    grey_out,
    plain,
)
from overlay_manager.dashboard.model import ActionResult, OverlayModel
from overlay_manager.dashboard.peer_table import COLUMN_KEYS, PeerTable
from overlay_manager.dashboard.plot import HistoryPlot
from overlay_manager.dashboard.status_panel import STATUS_FIELDS, clear_status, show_status
from overlay_manager.dashboard.topic_table import TopicTable
from overlay_manager.view import text as fmt
from overlay_manager.view import topics as tv
from overlay_manager.view.state import DEFAULT_NODE, node_choices, normalise_node

UI_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resource", "overlay_dashboard.ui")

SETTING_NODE = "node"
SETTING_HIDDEN = "hidden_columns"
SETTING_SORT_COLUMN = "sort_column"
SETTING_SORT_ORDER = "sort_order"
SETTING_KEYS = (SETTING_NODE, SETTING_HIDDEN, SETTING_SORT_COLUMN, SETTING_SORT_ORDER)
PATH_LOG_MAX = 500


class OverlayDashboardWidget(QWidget):
    """The dashboard view for the node the model has selected."""

    def __init__(self, model: OverlayModel, parent: Optional[QWidget] = None) -> None:
        """Load the .ui, connect the model's signals (queued) and the widgets' own signals."""
        super().__init__(parent)
        loadUi(UI_FILE, self)
        self.setObjectName("OverlayDashboardWidget")
        self._model = model
        self._peers: Dict[str, Any] = {}          # name -> Peer message from the last PeerList
        self._status: Any = None
        self._user_picked_node = False
        self._busy: Dict[str, str] = {}           # peer -> running action
        self._stale = False                       # the rows are greyed out as stale
        self._peers_stale = False                 # the last ~peers said the node's view is stale
        self._links: Any = None                   # the last TopicLinkList (repainted after stale)

        self.plot = HistoryPlot(self.plot_container)
        self.plot_layout.addWidget(self.plot)
        self._peer_view = PeerTable(self.peer_table, self.columns_button, self)
        self._topic_view = TopicTable(self.topic_table, self.topics_label)
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

    # ------------------------------------------------------------------ columns and settings
    def set_column_visible(self, key: str, visible: bool) -> None:
        """Show or hide a peer-table column by key (see COLUMNS)."""
        self._peer_view.set_column_visible(key, visible)

    def hidden_columns(self) -> List[str]:
        """Keys of the hidden peer-table columns."""
        return self._peer_view.hidden_columns()

    def save_state(self) -> Dict[str, str]:
        """Settings as strings: selected node, hidden columns, sort column and order."""
        column, order = self._peer_view.sort_setting()
        return {
            SETTING_NODE: self._model.node(),
            SETTING_HIDDEN: ",".join(self.hidden_columns()),
            SETTING_SORT_COLUMN: column,
            SETTING_SORT_ORDER: order,
        }

    def restore_state(self, state: Mapping[str, Any]) -> None:
        """Apply settings from save_state (missing or unknown values keep the defaults)."""
        hidden = set(fmt.split_csv(state.get(SETTING_HIDDEN)))
        for key in COLUMN_KEYS:
            self.set_column_visible(key, key not in hidden)
        self._peer_view.sort_by(str(state.get(SETTING_SORT_COLUMN) or "name"),
                                str(state.get(SETTING_SORT_ORDER)) == "desc")
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
        items, selected = node_choices(nodes, current, self._user_picked_node)
        self.node_combo.blockSignals(True)
        self.node_combo.clear()
        self.node_combo.addItems(items)
        self.node_combo.setCurrentText(selected)
        self.node_combo.blockSignals(False)
        if selected != current:
            self._model.set_node(selected)

    def _on_node_changed(self, node: str) -> None:
        self._peers.clear()
        self._status = None
        self._stale = False
        self._peers_stale = False
        self._links = None
        self._peer_view.clear()
        self._topic_view.clear(f"waiting for {node}/topic_links" if node else "no node selected")
        self.path_log.clear()
        clear_status(self)
        self._set_headline(f"waiting for {node}/peers" if node else "no node selected")
        self._on_selection()

    # ------------------------------------------------------------------ model data
    def _on_peers(self, msg: Any) -> None:
        selected = self.selected_peer()
        self._peers = {p.name: p for p in msg.peers}
        self._peer_view.fill(msg.peers, self._model.rates)
        if selected:
            self._peer_view.select(selected)
        self._peers_stale = bool(getattr(msg, "stale", False))
        if self._stale:
            self._stale = False
            if self._links is not None:
                self._on_topic_links(self._links)
        self._set_headline(fmt.peer_counts(msg.peers))
        self._check_stale()
        self._update_selected_panel()

    def _on_status(self, msg: Any) -> None:
        self._status = msg
        if getattr(msg, "stale", False) or self._stale:
            self._check_stale()  # the reason it gives replaces the headline at once
        show_status(self, msg)

    def _on_topic_links(self, msg: Any) -> None:
        self._links = msg
        self._topic_view.fill(msg.links)

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
        return self._peer_view.selected()

    def select_peer(self, name: str) -> bool:
        """Select a peer's row by name; False when it is not in the table."""
        return self._peer_view.select(name)

    def row_of(self, name: str) -> int:
        """Row index of a peer in the table (-1 = not shown)."""
        return self._peer_view.row_of(name)

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
        self.headline_label.setText(coloured(reason, fmt.LEVEL_ERROR))
        for table in (self.peer_table, self.topic_table):
            grey_out(table)

    def _on_tick(self) -> None:
        self._check_stale()
        self._peer_view.show_ages()
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
        self.headline_label.setText(coloured(text, fmt.LEVEL_ERROR))

    def _append_result(self, text: str, level: str) -> None:
        stamp = fmt.format_clock(time.time())
        self.result_text.appendHtml(coloured(f"{stamp}  {text}", level))

    def last_result(self) -> str:
        """The newest line of the result box (tests and logs)."""
        lines = self.result_text.toPlainText().splitlines()
        return lines[-1] if lines else ""

    def snapshot(self) -> Dict[str, Any]:
        """What the view shows right now, as plain data (tests, logs): the selected node, headline,
        this machine's fields (plain text), the peer table (cell texts by column key plus the path
        cell's and the row's background colours), the path-change log (newest first), the last
        action result, whether the node is marked stale, and the Topics view."""
        fields = {name: plain(getattr(self, f"{name}_value").text())
                  for name in (*STATUS_FIELDS, "selected")}
        return {
            "node": self._model.node(),
            "nodes": [self.node_combo.itemText(i) for i in range(self.node_combo.count())],
            "headline": plain(self.headline_label.text()),
            "fields": fields,
            "nat_detail": self.nat_value.toolTip(),
            "rows": self._peer_view.rows(),
            "selected_peer": self.selected_peer(),
            "path_log": [self.path_log.item(i).text() for i in range(self.path_log.count())],
            "last_result": self.last_result(),
            "stale": self._stale,
            "topics_headline": plain(self.topics_label.text()),
            "topics": self.topic_rows(),
        }

    def topic_rows(self) -> List[Dict[str, str]]:
        """The Topics view as plain data: cell texts by column key plus the path cell's colour."""
        return self._topic_view.rows()

    def shutdown(self) -> None:
        """Stop the clock (the model is shut down by its owner)."""
        self._tick.stop()
