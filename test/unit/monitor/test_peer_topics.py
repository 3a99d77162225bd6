"""Which peers get a ~links/<peer> topic (monitor/peer_topics.py): the modes, the cap, no churn,
the linger after a peer stops being chosen, ROS-legal names, and the node.* keys that set them."""

from __future__ import annotations

import math
import os

import pytest
import yaml

from overlay_manager.core.config import apply_overrides, load_robot_config
from overlay_manager.core.peers import PeerState
from overlay_manager.core.validation.errors import ConfigError
from overlay_manager.monitor.peer_topics import EMPTY, LINGER_S, PeerTopic, plan_topics, topic_name

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "config", "robot.example.yaml")


def peer(name, ms=math.nan, active=False, node_id=None, dns=None):
    return PeerState(name=name, dns_name=dns if dns is not None else f"{name}.fleet.internal",
                     addresses=("100.64.0.9",), online=True, active=active, path="direct",
                     latency_ms=ms, node_id=node_id if node_id is not None else f"id-{name}")


def names(plan):
    return sorted(t.name for t in plan.topics.values())


def test_watched_chooses_the_peers_with_a_latency_under_ros_names():
    peers = [peer("alpha-robot1", 12.5), peer("4th-robot", 3.0), peer("Base-Station"), peer("laptop", active=True)]
    plan = plan_topics(peers, "watched", 16, EMPTY, 0.0)
    assert names(plan) == ["links/alpha_robot1", "links/h_4th_robot"]
    assert plan.topics["id-alpha-robot1"] == PeerTopic("id-alpha-robot1", "links/alpha_robot1", "alpha-robot1")


def test_active_adds_the_peers_with_traffic_and_none_chooses_nothing():
    peers = [peer("alpha-robot1", 12.5), peer("laptop", active=True), peer("idle-one")]
    assert names(plan_topics(peers, "active", 16, EMPTY, 0.0)) == ["links/alpha_robot1", "links/laptop"]
    assert plan_topics(peers, "none", 16, EMPTY, 0.0) is EMPTY
    assert plan_topics(peers, "watched", 0, EMPTY, 0.0) is EMPTY


def test_the_cap_prefers_a_latency_then_the_name_and_never_takes_a_place_away():
    peers = [peer("d", active=True), peer("c", 1.0), peer("b", active=True), peer("a", active=True)]
    first = plan_topics(peers, "active", 2, EMPTY, 0.0)
    assert names(first) == ["links/a", "links/c"]
    # a peer with a latency appears: it waits for a place, nobody loses theirs
    second = plan_topics(peers + [peer("aa", 2.0)], "active", 2, first, 1.0)
    assert names(second) == ["links/a", "links/c"]
    assert second.topics["id-a"] is first.topics["id-a"]
    # a leaves the tailnet: its place goes to the peer with a latency first
    third = plan_topics([p for p in peers if p.name != "a"] + [peer("aa", 2.0)], "active", 2, second, 2.0)
    assert names(third) == ["links/aa", "links/c"]


def test_a_peer_keeps_its_topic_for_the_linger_and_loses_it_when_it_leaves():
    plan = plan_topics([peer("robot1", 5.0)], "watched", 16, EMPTY, 100.0)
    # a path change dropped the latency: the topic stays (its plot shows the gap)
    later = plan_topics([peer("robot1")], "watched", 16, plan, 100.0 + LINGER_S)
    assert names(later) == ["links/robot1"] and later.chosen_at["id-robot1"] == 100.0
    assert names(plan_topics([peer("robot1")], "watched", 16, later, 100.0 + LINGER_S + 1)) == []
    # measured again within the linger: chosen again from now on
    again = plan_topics([peer("robot1", 6.0)], "watched", 16, later, 150.0)
    assert again.chosen_at["id-robot1"] == 150.0
    # gone from the tailnet view: at once
    assert names(plan_topics([peer("other")], "watched", 16, plan, 101.0)) == []


def test_a_renamed_peer_gets_the_new_name_and_one_name_goes_to_one_peer():
    plan = plan_topics([peer("robot1", 5.0, node_id="n1")], "watched", 16, EMPTY, 0.0)
    renamed = plan_topics([peer("robot-one", 5.0, node_id="n1")], "watched", 16, plan, 1.0)
    assert renamed.topics["n1"] == PeerTopic("n1", "links/robot_one", "robot-one")
    # a re-enrolled machine next to its old node: the same host name, two keys
    twins = plan_topics([peer("robot1", 5.0, node_id="old"), peer("robot1", 4.0, node_id="new")],
                        "watched", 16, EMPTY, 0.0)
    assert names(twins) == ["links/robot1"] and len(twins.topics) == 1


def test_topic_name_of_odd_host_names():
    assert topic_name(peer("Lab-Laptop")) == "links/lab_laptop"
    assert topic_name(peer("", dns="robot9.fleet.internal")) == "links/robot9"
    assert topic_name(peer("", dns="")) is None


def test_node_keys_in_the_config_and_as_params(tmp_path):
    cfg = load_robot_config(EXAMPLE)
    assert (cfg.node.link_topics, cfg.node.max_link_topics) == ("watched", 16)
    cfg = apply_overrides(cfg, {"link_topics": "active", "max_link_topics": 4}, "params")
    assert (cfg.node.link_topics, cfg.node.max_link_topics) == ("active", 4)
    with pytest.raises(ConfigError) as err:
        apply_overrides(cfg, {"link_topics": "all"}, "/alpha_laptop/overlay_manager private parameters")
    assert "node.link_topics" in str(err.value) and "watched, active, none" in str(err.value)
    data = yaml.safe_load(open(EXAMPLE))
    data["node"]["max_link_topics"] = -1
    bad = tmp_path / "robot.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="node.max_link_topics"):
        load_robot_config(str(bad))
