"""What a host worker starts from (#31 point 1): `node_env`, never the agent's own environment, so a worker does
not depend on how its agent was launched (a venv binary not on PATH, a developer's PYTHONPATH)."""

from __future__ import annotations

import os

from nodeagent.rank_env import SYSTEM_PATH, node_env

AGENT = {"PATH": "/opt/weird/bin", "PYTHONPATH": "/src/checkout", "VIRTUAL_ENV": "/other/venv", "LANG": "C.UTF-8",
         "LD_PRELOAD": "/x.so", "HOME": "/home/agent", "CORRAL_NATS_URL": "nats://x"}


def test_path_is_corrals_interpreter_then_the_system_whatever_the_agents_path() -> None:
    env = node_env(AGENT, python="/pipx/venvs/corral/bin/python")
    assert env["PATH"] == f"/pipx/venvs/corral/bin:{SYSTEM_PATH}"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_only_the_account_and_locale_come_from_the_agent() -> None:
    env = node_env(AGENT, python="/v/bin/python")
    assert env["HOME"] == "/home/agent" and env["LANG"] == "C.UTF-8"
    assert not {"PYTHONPATH", "VIRTUAL_ENV", "LD_PRELOAD", "CORRAL_NATS_URL"} & set(env)


def test_the_account_is_filled_in_when_the_agent_environment_lacks_it() -> None:
    env = node_env({}, python="/v/bin/python")
    assert env["USER"] and env["LOGNAME"] == env["USER"] and env["HOME"] and env["SHELL"]
    assert env["HOME"] == os.path.expanduser("~" + env["USER"])
