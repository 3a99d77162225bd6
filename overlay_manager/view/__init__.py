"""The view model every front end shares (pure: no Qt, no ROS; unit-tested on its own).

``text`` (colours and plain words for paths, levels, rates and ages), ``state`` (node discovery,
the node selector, per-peer history, when a node is stale) and ``topics`` (rows of the Topics
view). The rqt dashboard imports them from here, and so would any other front end (a web page):
they read ROS messages by field name, so they need neither rospy nor the generated messages.
"""
