"""`--policy` of `corral scheduler` and `corral up`, and the policy an election records (issue #42)."""

from __future__ import annotations

import subprocess

import msgspec
import pytest

from orchestrator.cli.render import essentials
from orchestrator.policies.named import POLICY_NAMES, policies_for
from orchestrator.sim import baselines
from schemas import SchedulerElected, decode, encode
from tests.integration.harness import CORRAL


@pytest.mark.parametrize("command", ["scheduler", "up"])
def test_an_unknown_policy_exits_2_naming_the_known_ones(command: str) -> None:
    proc = subprocess.run([CORRAL, command, "--policy", "sjf"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid choice: 'sjf'" in lines[0], proc.stderr
    assert all(f"'{name}'" in lines[0] for name in POLICY_NAMES), lines[0]


def test_the_simulator_and_the_scheduler_share_the_records() -> None:
    """`corral sim` finds its policies where the scheduler does: the same objects, not copies alike."""
    assert baselines.policies_for is policies_for and baselines.POLICY_NAMES is POLICY_NAMES
    assert {name: policies_for(name) for name in POLICY_NAMES} == {name: baselines.policies_for(name)
                                                                    for name in POLICY_NAMES}


def test_an_old_election_reads_and_writes_as_before() -> None:
    old = b'{"type":"SchedulerElected","epoch":1,"scheduler_id":"s1","event_id":"elect:1:s1:ab","occurred_at":1.0}'
    e = decode(old)
    assert isinstance(e, SchedulerElected) and e.policy is msgspec.UNSET
    assert encode(e) == old
    assert essentials(e) == "epoch=1 s1"


def test_a_new_election_names_its_policy() -> None:
    e = SchedulerElected(event_id="elect:2:s2:cd", occurred_at=2.0, epoch=2, scheduler_id="s2", policy="drf")
    back = decode(encode(e))
    assert back == e and isinstance(back, SchedulerElected) and back.policy == "drf"
    assert essentials(e) == "epoch=2 s2 policy=drf"
