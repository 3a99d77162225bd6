"""Qt pieces the dashboard's tables and labels share: sortable table items, the path cell (its
path's colour, kept when the row is selected), the stale grey, and rich text in a level's colour.

Only Qt here, no ROS; what a cell says comes from the pure ``format`` and ``topics`` modules.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Sequence, Tuple

from python_qt_binding.QtCore import Qt
from python_qt_binding.QtGui import QBrush, QColor, QPen
from python_qt_binding.QtWidgets import (
    QHeaderView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
)

from overlay_manager.view import text as fmt

SORT_ROLE = Qt.UserRole + 1
STALE_FOREGROUND = "#9e9e9e"   # text of every cell while the node is stale
STALE_BACKGROUND = "#eeeeee"   # background of every cell (path cells too) while the node is stale


class SortItem(QTableWidgetItem):
    """Table item that sorts by a key stored under SORT_ROLE (numbers sort as numbers)."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        a, b = self.data(SORT_ROLE), other.data(SORT_ROLE)
        if a is None or b is None or type(a) is not type(b):
            return super().__lt__(other)
        return a < b


class PathDelegate(QStyledItemDelegate):
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


def item(text: str, sort_key: Any = None, tooltip: str = "") -> SortItem:
    """A table item showing ``text``, sorted by ``sort_key`` (default: the text, ignoring case)."""
    it = SortItem(text)
    it.setData(SORT_ROLE, text.lower() if sort_key is None else sort_key)
    if tooltip:
        it.setToolTip(tooltip)
    return it


def paint_path_cell(path_item: QTableWidgetItem, path: str) -> None:
    """White text, centred, on the path's colour (the row itself only has the path's tint)."""
    path_item.setBackground(QBrush(QColor(fmt.path_colour(path))))
    path_item.setForeground(QBrush(QColor("#ffffff")))
    path_item.setTextAlignment(Qt.AlignCenter)


def grey_out(table: QTableWidget) -> None:
    """Paint every cell of ``table`` in the stale colours (the next fill repaints them)."""
    grey, back = QBrush(QColor(STALE_FOREGROUND)), QBrush(QColor(STALE_BACKGROUND))
    for row in range(table.rowCount()):
        for column in range(table.columnCount()):
            cell = table.item(row, column)
            if cell is not None:
                cell.setForeground(grey)
                cell.setBackground(back)


class PathTable:
    """A QTableWidget whose every row crosses one overlay path: the row is tinted by its path, the
    path cell has the path's colour (kept when the row is selected) and white centred text.

    Attributes:
        table: the QTableWidget (from the .ui file).
        keys: the column keys, in column order.
        col: column key -> column index.
    """

    def __init__(self, table: QTableWidget, columns: Sequence[Tuple[str, str, str]], sort_key: str,
                 widths: Sequence[Tuple[str, int]]) -> None:
        """One column per (key, header, tooltip) of ``columns`` (there is a "path" column),
        resizable by the user, rows one line of text high, sorted by ``sort_key``; ``widths``
        gives (key, pixels) starting widths."""
        self.table = table
        self.keys = tuple(c[0] for c in columns)
        self.col = {key: i for i, key in enumerate(self.keys)}
        table.setColumnCount(len(columns))
        for i, (_, header, tip) in enumerate(columns):
            head = QTableWidgetItem(header)
            head.setToolTip(tip)
            table.setHorizontalHeaderItem(i, head)
        table.horizontalHeader().setSectionResizeMode(QHeaderView.Interactive)
        table.sortItems(self.col[sort_key], Qt.AscendingOrder)
        table.verticalHeader().setDefaultSectionSize(table.fontMetrics().height() + 8)
        self._path_delegate = PathDelegate(table)
        table.setItemDelegateForColumn(self.col["path"], self._path_delegate)
        for key, width in widths:
            table.setColumnWidth(self.col[key], width)

    def put_row(self, row: int, items: Dict[str, QTableWidgetItem], path: str, foreground: str = "") -> None:
        """Put ``items`` (by column key) into ``row`` in the tint of ``path``, the path cell in the
        path's colour; ``foreground`` ("#rrggbb", "" = the default) colours the other cells' text."""
        tint = QBrush(QColor(fmt.path_tint(path)))
        for key, it in items.items():
            it.setBackground(tint)
            if foreground:
                it.setForeground(QBrush(QColor(foreground)))
            self.table.setItem(row, self.col[key], it)
        paint_path_cell(items["path"], path)

    def row_texts(self, row: int) -> Dict[str, str]:
        """The texts of one row by column key ("" for an empty cell) plus the path cell's
        background colour (``path_colour``, ``#rrggbb``)."""
        t = self.table
        cells = {key: (t.item(row, self.col[key]).text() if t.item(row, self.col[key]) else "")
                 for key in self.keys}
        cells["path_colour"] = background_name(t.item(row, self.col["path"]))
        return cells


def background_name(cell: Any) -> str:
    """A cell's background colour as ``#rrggbb`` ("" for no cell)."""
    return cell.background().color().name() if cell else ""


def coloured(text: str, level: fmt.Level) -> str:
    """Rich text in a level's colour (labels)."""
    colour = fmt.LEVEL_COLOURS.get(level, fmt.LEVEL_COLOURS[fmt.LEVEL_UNKNOWN])
    return f'<span style="color:{colour}">{escape(text)}</span>'


def plain(text: str) -> str:
    """A label's text without the markup of :func:`coloured`."""
    return re.sub(r"<[^>]*>", "", text).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def escape(text: str) -> str:
    """``text`` with ``&``, ``<`` and ``>`` escaped for rich text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
