"""overlay_manager: a self-hosted Tailscale/Headscale overlay made ROS-native.

The generated message modules (overlay_manager.msg, overlay_manager.srv) live in the catkin
devel/install space; extending ``__path__`` lets them be found whichever copy of this package
Python imports first (the source tree or the devel space).
"""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
