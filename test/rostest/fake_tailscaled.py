#!/usr/bin/python3
"""rostest stand-in for tailscaled: serves recorded LocalAPI JSON on a unix socket.

Usage: fake_tailscaled.py SOCKET  (serves until killed; roslaunch ends it by pid).
Also writes a robot config next to the socket (SOCKET + ".robot.yaml") pointing at it.
"""
import os
import sys
import time

from overlay_manager.testing.tsfake import FakeTailscaled

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("__")]
    fake = FakeTailscaled()
    target = args[0]
    if os.path.lexists(target):
        os.unlink(target)
    os.symlink(fake.socket_path, target)
    try:
        while True:
            time.sleep(1)
    finally:
        fake.close()


if __name__ == "__main__":
    main()
