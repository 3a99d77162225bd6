"""A small QPainter plot of one peer's latency and rx/tx rate history (no matplotlib needed)."""

from __future__ import annotations

import math
import time
from typing import Callable, List, Optional, Sequence, Tuple

from python_qt_binding.QtCore import QPointF, QRectF, QSize, Qt
from python_qt_binding.QtGui import QColor, QPainter, QPainterPath, QPen
from python_qt_binding.QtWidgets import QSizePolicy, QWidget

from overlay_manager.view import text as fmt
from overlay_manager.view.state import Sample

LATENCY_COLOUR = "#6a1b9a"
RX_COLOUR = "#1565c0"
TX_COLOUR = "#e65100"
WINDOW_S = 300.0  # the plot shows at most the last five minutes
MIN_WINDOW_S = 30.0  # and at least the last half minute


class HistoryPlot(QWidget):
    """Two stacked panes over the last WINDOW_S seconds: latency (ms) and rx/tx (bit/s)."""

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        """Empty until set_samples()."""
        super().__init__(parent)
        self._samples: List[Sample] = []
        self._title = ""
        self._now: Optional[float] = None
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        self.setMinimumHeight(110)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """Preferred size."""
        return QSize(420, 180)

    def set_samples(self, title: str, samples: Sequence[Sample], now: Optional[float] = None) -> None:
        """Show a peer's history; now (POSIX s) anchors the right edge (default: the clock)."""
        self._title = title
        self._samples = list(samples)
        self._now = now
        self.update()

    def paintEvent(self, event: object) -> None:  # noqa: N802 (Qt override)
        """Draw both panes."""
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        painter.fillRect(self.rect(), QColor("#ffffff"))
        rect = QRectF(self.rect()).adjusted(4, 4, -4, -4)
        if not self._title:
            painter.setPen(QColor("#757575"))
            painter.drawText(rect, Qt.AlignCenter, "select a peer to see its history")
            return
        now = self._now if self._now is not None else time.time()
        first = self._samples[0].t if self._samples else now
        window = min(WINDOW_S, max(MIN_WINDOW_S, now - first))  # grows with the history
        t0 = now - window
        samples = [s for s in self._samples if s.t >= t0]
        top = QRectF(rect.left(), rect.top(), rect.width(), rect.height() / 2 - 2)
        bottom = QRectF(rect.left(), rect.top() + rect.height() / 2 + 2, rect.width(),
                        rect.height() / 2 - 2)
        self._pane(painter, top, t0, now, "latency",
                   [(LATENCY_COLOUR, "latency", [(s.t, s.latency_ms) for s in samples])],
                   fmt.format_latency)
        self._pane(painter, bottom, t0, now, "rate",
                   [(RX_COLOUR, "rx", [(s.t, s.rx_bytes_per_s * 8.0) for s in samples]),
                    (TX_COLOUR, "tx", [(s.t, s.tx_bytes_per_s * 8.0) for s in samples])],
                   fmt.format_bitrate)
        painter.end()

    def _pane(self, painter: QPainter, rect: QRectF, t0: float, t1: float, title: str,
              series: List[Tuple[str, str, List[Tuple[float, float]]]],
              label: Callable[[float], str]) -> None:
        painter.setPen(QPen(QColor("#bdbdbd"), 1))
        painter.drawRect(rect)
        values = [v for _, _, pts in series for _, v in pts if not math.isnan(v)]
        vmax = max(values) if values else 0.0
        vmax = vmax * 1.15 if vmax > 0 else 1.0
        legend = "  ".join(f"{name} {label(_last(pts))}" for _, name, pts in series)
        painter.setPen(QColor("#424242"))
        text_rect = rect.adjusted(4, 2, -4, -2)
        peak = label(max(values) if values else math.nan)
        painter.drawText(text_rect, Qt.AlignLeft | Qt.AlignTop, f"{title}  (max {peak})")
        painter.drawText(text_rect, Qt.AlignRight | Qt.AlignTop, legend)
        span = t1 - t0
        painter.drawText(text_rect, Qt.AlignLeft | Qt.AlignBottom,
                         f"-{span / 60:.0f} min" if span >= 120 else f"-{span:.0f} s")
        painter.drawText(text_rect, Qt.AlignRight | Qt.AlignBottom, "now")
        if not values:
            painter.drawText(rect, Qt.AlignCenter, "no data yet")
            return
        plot = rect.adjusted(2, 16, -2, -16)
        for colour, _, pts in series:
            path = QPainterPath()
            started = False
            for t, v in pts:
                if math.isnan(v):
                    started = False  # a gap where the value was unknown
                    continue
                x = plot.left() + (t - t0) / (t1 - t0) * plot.width()
                y = plot.bottom() - v / vmax * plot.height()
                if started:
                    path.lineTo(QPointF(x, y))
                else:
                    path.moveTo(QPointF(x, y))
                    started = True
            painter.setPen(QPen(QColor(colour), 1.6))
            painter.drawPath(path)
            last = [(t, v) for t, v in pts if not math.isnan(v)]
            if len(last) == 1:  # a single point is not a line: draw a dot
                x = plot.left() + (last[0][0] - t0) / (t1 - t0) * plot.width()
                y = plot.bottom() - last[0][1] / vmax * plot.height()
                painter.setBrush(QColor(colour))
                painter.drawEllipse(QPointF(x, y), 2.5, 2.5)


def _last(points: List[Tuple[float, float]]) -> float:
    """Last known value of a series (NaN when none)."""
    for _, v in reversed(points):
        if not math.isnan(v):
            return v
    return math.nan
