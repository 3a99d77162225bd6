"""view.state.node_choices: the node selector lists only nodes that exist (pure)."""

from __future__ import annotations

from overlay_manager.view.state import DEFAULT_NODE, node_choices, nodes_from_topics

LAPTOP = "/alpha_laptop/overlay_manager"
ROBOT = "/alpha_robot1/overlay_manager"


def test_the_default_gives_way_to_the_only_node_found_and_is_not_listed():
    found = nodes_from_topics([(f"{LAPTOP}/peers", "overlay_manager/PeerList")])
    assert node_choices(found, DEFAULT_NODE, user_picked=False) == ([LAPTOP], LAPTOP)


def test_the_default_stays_while_nothing_is_found():
    assert node_choices([], DEFAULT_NODE, user_picked=False) == ([DEFAULT_NODE], DEFAULT_NODE)


def test_the_default_is_listed_when_it_really_exists():
    found = nodes_from_topics([(f"{LAPTOP}/peers", "overlay_manager/PeerList"),
                               ("/overlay_manager/peers", "overlay_manager/PeerList")])
    assert node_choices(found, DEFAULT_NODE, user_picked=False) == ([DEFAULT_NODE, LAPTOP], DEFAULT_NODE)


def test_a_found_node_stays_selected_and_others_are_listed():
    assert node_choices([ROBOT, LAPTOP], LAPTOP, user_picked=False) == ([ROBOT, LAPTOP], LAPTOP)


def test_a_user_pick_stays_even_when_it_is_not_found():
    assert node_choices([LAPTOP], "/nobody/overlay_manager", user_picked=True) == \
        ([LAPTOP, "/nobody/overlay_manager"], "/nobody/overlay_manager")


def test_a_node_that_went_away_gives_way_to_one_that_exists_unless_none_does():
    assert node_choices([ROBOT], LAPTOP, user_picked=False) == ([ROBOT], ROBOT)
    assert node_choices([], LAPTOP, user_picked=False) == ([LAPTOP], LAPTOP)


def test_no_current_node_takes_the_first_found():
    assert node_choices([ROBOT, LAPTOP], "", user_picked=False) == ([ROBOT, LAPTOP], ROBOT)
    assert node_choices([], "", user_picked=False) == ([], "")
