"""A job that brings its own PATH (its submitter's, exported by default: #41) keeps it first, then the node's
entries it lacks (nodeagent/rank_env.py: `over_node_env`)."""

from __future__ import annotations

from nodeagent.rank_env import over_node_env

NODE = {"PATH": "/venv/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/home/agent", "PYTHONUNBUFFERED": "1"}


def test_the_jobs_path_first_then_what_the_node_has_that_it_lacks() -> None:
    env = over_node_env(NODE, {"PATH": "/home/u/.venv/bin:/usr/bin", "HOME": "/home/u", "RANK": "0"})
    assert env == {"PATH": "/home/u/.venv/bin:/usr/bin:/venv/bin:/usr/local/bin:/bin", "HOME": "/home/u",
                   "PYTHONUNBUFFERED": "1", "RANK": "0"}


def test_without_a_path_of_its_own_the_node_s_and_nothing_added_when_it_has_every_entry() -> None:
    assert over_node_env(NODE, {"A": "1"}) == {**NODE, "A": "1"}
    same = "/usr/bin:/bin:/venv/bin:/usr/local/bin"
    assert over_node_env(NODE, {"PATH": same})["PATH"] == same
    assert over_node_env(NODE, {"PATH": ""})["PATH"] == NODE["PATH"]
    assert over_node_env({}, {"PATH": "/x"}) == {"PATH": "/x"}  # a container: no node baseline
