"""Overlay dashboard: rqt plugin and standalone window showing one overlay_manager node.

Layout (as in rqt_robot_monitor): ``plugin`` only wires rqt to the widget; ``widget`` is the view
(loaded from ``resource/overlay_dashboard.ui``) with its parts ``peer_table``, ``topic_table``,
``status_panel``, ``plot`` and ``cells``; ``model`` is a QObject that owns the subscribers and
service proxies and signals the widget over queued connections. The pure view model they show
(``text``, ``state``, ``topics``: no Qt, no ROS) is one layer lower, in ``overlay_manager.view``.
"""
