"""Overlay dashboard: rqt plugin and standalone window showing one overlay_manager node.

Layout (as in rqt_robot_monitor): ``plugin`` only wires rqt to the widget; ``widget`` is the view
(loaded from ``resource/overlay_dashboard.ui``); ``model`` is a QObject that owns the subscribers
and service proxies and signals the widget over queued connections. ``format`` and ``history``
are pure Python (no Qt, no ROS) and unit-tested on their own.
"""
