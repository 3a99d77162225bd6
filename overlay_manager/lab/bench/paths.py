"""The benchmark's five paths between two buildings, and how each is set up (see run.py).

``underlay`` (port forwards in both NATs, building addresses on ``lo``), ``wireguard`` (plain
wireguard-go behind one port forward), ``ts-direct``, ``ts-derp`` and ``ts-peer-relay``
(tailscale with overlay names; the last through the fleet's peer relay on the campus server
network). :class:`PathSetup` gives each path's ROS environment and server address, starts the
robot side (the lab camera and Twist echo from probe/rosnodes.py) and sets up and removes the port
forwards and the WireGuard tunnel.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from overlay_manager.lab.campus import robots, system
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.system import wait_for

PY = "/usr/bin/python3"
SPEC: Dict[str, Any] = {
    "name": "bench",
    "buildings": {
        "b1": {"nat": "eim-adpf", "hosts": {"robot1": {"team": "alpha", "role": "robot"}}},
        "b2": {"nat": "eim-adpf", "hosts": {"laptop": {"team": "alpha", "role": "operator"},
                                            "laptop2": {"team": "alpha", "role": "operator"},
                                            "laptop3": {"team": "alpha", "role": "operator"}}},
        "campus": {"nat": "public", "hosts": {"relay1": {"team": "alpha", "role": "base_station"}}},
    },
    "teams": {"alpha": {"master": "robot1"}},
    "relays": {"relay1": {"port": 40000}},
}
"""The bench's lab: robot1 alone in b1, three operators in b2, both buildings behind eim-adpf NATs;
relay1, the fleet's peer relay, on the campus server network (a ``public`` building)."""
ROBOT, LAPTOP, LAPTOP2, LAPTOP3, RELAY, B1, B2 = "robot1", "laptop", "laptop2", "laptop3", "relay1", "b1", "b2"
PATHS = ("underlay", "wireguard", "ts-direct", "ts-derp", "ts-peer-relay")
WG_NET = {ROBOT: "10.99.0.1", LAPTOP: "10.99.0.2"}
WG_PORT = 51820
IPERF_PORT = 5201
IMAGE_W, IMAGE_H, IMAGE_HZ, CONTROL_HZ = 640, 480, 30.0, 50.0
"""Camera frame size (pixels, rgb8) and rate (Hz); rate of the Twist round trip (Hz)."""


def say(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def topic_prefix(path: str) -> str:
    """Namespace of the bench topics on ``path`` (``/bench/ts_direct``, ...)."""
    return f"/bench/{path.replace('-', '_')}"


class PathSetup:
    """Per-path environment and set-up in one bench lab run."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.helpers: Dict[str, List[subprocess.Popen]] = {}
        """Robot-side processes per path (camera, echo) and ``wg:<host>`` wireguard-go daemons."""
        self.fw_handles: Dict[str, int] = {}

    # --- environment per path -------------------------------------------------------------
    def ros_setup(self, path: str, host: str) -> str:
        """Shell line that sets the ROS env of ``host`` for ``path``."""
        if path.startswith("ts-"):
            cfg = shlex.quote(str(self.lab.robot_yaml(host)))
            return f'eval "$(rosrun overlay_manager overlay_env --config {cfg})"'
        if path == "wireguard":
            master, ip = WG_NET[ROBOT], WG_NET[host]
        else:
            master, ip = self.lab.address(B1), self.lab.address(self.lab.spec.host(host).building)
        return f"unset ROS_HOSTNAME; export ROS_MASTER_URI=http://{master}:11311 ROS_IP={ip}"

    def server_address(self, path: str) -> str:
        """robot1's address on ``path`` (iperf3, ping)."""
        if path.startswith("ts-"):
            return self.lab.overlay_ip(ROBOT)
        return WG_NET[ROBOT] if path == "wireguard" else self.lab.address(B1)

    def module_argv(self, path: str, host: str, module: str, args: Sequence[str]) -> List[str]:
        """``python3 -m overlay_manager.lab.<module> args`` on ``host`` with ``path``'s ROS env."""
        line = " ".join(shlex.quote(a) for a in args)
        return ["bash", "-c", f"{self.ros_setup(path, host)} && exec {PY} -m overlay_manager.lab.{module} {line}"]

    def start_robot_helper(self, path: str) -> None:
        """The lab camera (IMAGE_W x IMAGE_H rgb8 at IMAGE_HZ on <prefix>/image) and the Twist
        echo (<prefix>/cmd_vel -> <prefix>/cmd_vel_echo) on robot1, in ``path``'s ROS env."""
        prefix = topic_prefix(path)
        log_dir = Path(self.lab.host_dir(ROBOT))
        camera = ["camera", "--topic", f"{prefix}/image", "--rate", f"{IMAGE_HZ:g}",
                  "--width", str(IMAGE_W), "--height", str(IMAGE_H)]
        echo = ["echo", "--input", f"{prefix}/cmd_vel", "--output", f"{prefix}/cmd_vel_echo"]
        self.helpers[path] = [
            self.lab.popen(ROBOT, self.module_argv(path, ROBOT, "probe.rosnodes", args),
                           env=robots.ros_env(self.lab, ROBOT), log=log_dir / f"bench_{args[0]}_{path}.log")
            for args in (camera, echo)]

    def stop_robot_helper(self, path: str) -> None:
        """Stop robot1's camera and echo of ``path`` (by pid)."""
        for proc in self.helpers.pop(path, []):
            robots.stop(self.lab, proc)

    def stop_all(self) -> None:
        """Stop every helper this object started (robot side and wireguard-go)."""
        for p in [k for k in self.helpers if not k.startswith("wg:")]:
            self.stop_robot_helper(p)
        self.wireguard_down()

    # --- port forwards ------------------------------------------------------------------------
    def dmz(self, building: str, host: str, udp_ports: Sequence[int], tcp_icmp: bool) -> None:
        """Port forward new inbound traffic at ``building``'s router to ``host`` (own nft table plus one
        accept rule for DNATed packets in the lab's forward chain, after its runtime actions)."""
        ns = self.lab.namespace(building)
        target = self.lab.address(host)
        rules = []
        if tcp_icmp:
            rules.append(f'iifname "wan" meta l4proto {{ tcp, icmp }} dnat ip to {target}')
        if udp_ports:
            rules.append(f'iifname "wan" udp dport {{ {", ".join(map(str, udp_ports))} }} dnat ip to {target}')
        text = ("table ip olab_bench\ndelete table ip olab_bench\ntable ip olab_bench {\n"
                "  chain prerouting { type nat hook prerouting priority dstnat - 5; policy accept;\n"
                + "".join(f"    {r}\n" for r in rules) + "  }\n}\n")
        say(f"({ns}) port forward to {host} {target}: " + "; ".join(rules))
        system.run(["nft", "-f", "-"], ns, echo=self.lab.echo, input=text, quiet=True)
        if building not in self.fw_handles:
            listing = system.run(["nft", "-a", "list", "chain", "inet", "olab", "forward"], ns,
                                 echo=self.lab.echo, quiet=True).stdout
            m = re.search(r"jump actions # handle (\d+)", listing)
            if not m:
                raise RuntimeError(f"no 'jump actions' rule in {ns}'s forward chain:\n{listing}")
            res = system.run(["nft", "--echo", "--handle", "add", "rule", "inet", "olab", "forward", "position",
                              m.group(1), "iifname", "wan", "ct", "status", "dnat", "accept",
                              "comment", '"bench port forward"'], ns, echo=self.lab.echo, quiet=True)
            self.fw_handles[building] = int(re.findall(r"# handle (\d+)", res.stdout)[-1])

    def undmz(self, building: str) -> None:
        """Remove :meth:`dmz`'s table and forward rule and flush the router's conntrack."""
        ns = self.lab.namespace(building)
        system.run(["nft", "delete", "table", "ip", "olab_bench"], ns, echo=self.lab.echo, check=False, quiet=True)
        h = self.fw_handles.pop(building, None)
        if h is not None:
            system.run(["nft", "delete", "rule", "inet", "olab", "forward", "handle", str(h)], ns,
                       echo=self.lab.echo, check=False, quiet=True)
        system.run(["conntrack", "-F"], ns, echo=self.lab.echo, check=False, quiet=True)

    def lo_alias(self, host: str, add: bool) -> None:
        """Add (or remove) the host's building public address on its ``lo`` (underlay ROS_IP)."""
        addr = self.lab.address(self.lab.spec.host(host).building)
        self.lab.exec(host, ["ip", "addr", "add" if add else "del", f"{addr}/32", "dev", "lo"], check=False)

    # --- plain WireGuard ----------------------------------------------------------------------
    def wg_if(self, host: str) -> str:
        """WireGuard interface name of a host: unique per run and host, because wireguard-go's UAPI
        socket (/var/run/wireguard/<ifname>.sock, which ``wg`` talks to) is not per namespace."""
        return f"wg{self.lab.run_id}{(ROBOT, LAPTOP).index(host)}"

    def wireguard_up(self) -> None:
        """wireguard-go on robot1 and the laptop, keys, addresses, and a first handshake."""
        keys: Dict[str, Tuple[Path, str]] = {}
        for h in (ROBOT, LAPTOP):
            priv = self.lab.exec(h, ["wg", "genkey"], quiet=True).stdout.strip()
            pub = self.lab.exec(h, ["wg", "pubkey"], input=priv + "\n", quiet=True).stdout.strip()
            kf = Path(self.lab.host_dir(h)) / "wg.key"
            kf.write_text(priv + "\n")
            kf.chmod(0o600)
            keys[h] = (kf, pub)
        for h in (ROBOT, LAPTOP):
            self.helpers[f"wg:{h}"] = [self.lab.popen(h, ["wireguard-go", "-f", self.wg_if(h)],
                                                      log=Path(self.lab.host_dir(h)) / "wireguard-go.log")]
        for h in (ROBOT, LAPTOP):
            wait_for(f"wireguard-go's {self.wg_if(h)} in {h}", lambda h=h: self.lab.exec(
                h, ["wg", "show", self.wg_if(h)], check=False, quiet=True).returncode == 0, 10)
        self.lab.exec(ROBOT, ["wg", "set", self.wg_if(ROBOT), "private-key", str(keys[ROBOT][0]),
                              "listen-port", str(WG_PORT),
                              "peer", keys[LAPTOP][1], "allowed-ips", f"{WG_NET[LAPTOP]}/32"])
        self.lab.exec(LAPTOP, ["wg", "set", self.wg_if(LAPTOP), "private-key", str(keys[LAPTOP][0]),
                               "peer", keys[ROBOT][1], "allowed-ips", f"{WG_NET[ROBOT]}/32",
                               "endpoint", f"{self.lab.address(B1)}:{WG_PORT}", "persistent-keepalive", "5"])
        for h in (ROBOT, LAPTOP):
            self.lab.exec(h, ["ip", "addr", "add", f"{WG_NET[h]}/24", "dev", self.wg_if(h)])
            self.lab.exec(h, ["ip", "link", "set", self.wg_if(h), "up"])
        wait_for("a WireGuard handshake laptop -> robot1", lambda: self.lab.exec(
            LAPTOP, ["ping", "-c", "1", "-W", "1", WG_NET[ROBOT]], check=False, quiet=True).returncode == 0, 20)

    def wireguard_down(self) -> None:
        """Stop wireguard-go (by pid) and delete the interfaces."""
        for h in (ROBOT, LAPTOP):
            for proc in self.helpers.pop(f"wg:{h}", []):
                robots.stop(self.lab, proc, timeout=5)
            self.lab.exec(h, ["ip", "link", "del", self.wg_if(h)], check=False, quiet=True)
