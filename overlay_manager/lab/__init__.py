"""Campus lab: buildings behind real NATs in network namespaces (pyroute2 + nftables + tc netem),
a control host running Headscale (through overlay_manager.fleet) and one tailscaled per host.

Quick use (as root)::

    from overlay_manager.lab.campus.core import Lab
    with Lab("config/lab/two_buildings.yaml") as lab:
        lab.tailscale_up("alpha-robot1"); lab.tailscale_up("alpha-laptop")
        lab.wait_enrolled()
        print(lab.ping("alpha-laptop", "alpha-robot1").path)   # direct
        lab.block_udp("b1")

See docs/lab.md.
"""
