"""Fixtures for test/gui (defined in dashboard_harness.py; a unique module name, because several
test directories have a conftest.py and `from conftest import ...` would pick the wrong one)."""

from dashboard_harness import fake_node, qapp, ros_env, roscore, rospy_node, xvfb  # noqa: F401
