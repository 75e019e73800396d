"""`corral submit --after-ok/--after-any` (orchestrator/cli/dependencies.py): names resolved, refused at submit.

Pure: the cluster state is folded here from events, no server.
"""

from __future__ import annotations

import pytest

from orchestrator.cli.dependencies import with_gates
from orchestrator.cli.errors import USAGE, CliError
from schemas.jobspec import MAX_DEPENDENCIES, ArrayElement, Gates, JobSpec
from tests.core.harness import Sim


def _state() -> Sim:
    s = Sim()
    s.submit("j1", gpus_per_rank=1)
    for i in range(2000):
        s.submit(f"A_{i}", gpus_per_rank=1, gates=Gates(array=ArrayElement(array_id="A", index=i, count=2000)))
    return s


def test_an_array_id_is_one_dependency_and_a_job_id_names_the_job() -> None:
    s = _state()
    spec = with_gates(s.state, JobSpec(name="x"), ["A", "j1"], ["A"], hold=True)
    g = spec.gating
    assert (g.after_ok, g.after_ok_arrays, g.after_any, g.after_any_arrays, g.hold) == (
        ("j1",), ("A",), (), ("A",), True)


def test_an_unknown_name_is_refused_saying_what_to_fix() -> None:
    with pytest.raises(CliError) as e:
        with_gates(_state().state, JobSpec(name="x"), ["j1", "ghost", "A_9999"], [], hold=False)
    assert e.value.code == USAGE
    assert str(e.value).startswith("--after-ok ghost, A_9999: no such job or job array in the log (submit it first")


def test_too_many_dependencies_are_refused_at_submit() -> None:
    s = _state()
    ids = [f"A_{i}" for i in range(MAX_DEPENDENCIES + 1)]
    with pytest.raises(CliError) as e:
        with_gates(s.state, JobSpec(name="x"), [], ids, hold=False)
    assert e.value.code == USAGE
    assert "gates.after_any: must name at most 1000 job ids, got 1001" in str(e.value)
    assert "name the array's id" in str(e.value)
