"""The JobSpec validator: every problem reported with its path at once; valid specs parse."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import InvalidJobSpec, JobSpec, Mount, Topology, jobspec_problems, parse_jobspec
from schemas.jobspec import CHECKPOINT_SIGNALS, MAX_GPUS_PER_RANK, MAX_NAME_LEN, MAX_RANKS


def paths(obj: Any) -> set[str]:
    return {p.path for p in jobspec_problems(obj)}


def test_a_minimal_spec_parses_with_defaults() -> None:
    spec = parse_jobspec({"name": "train"})
    assert spec == JobSpec(name="train")
    assert (spec.queue, spec.ranks, spec.gpus_per_rank, spec.restart_policy) == ("default", 1, 1, "gang")
    assert spec.total_gpus == 1


def test_a_full_spec_parses() -> None:
    spec = parse_jobspec({
        "name": "llama", "queue": "research", "priority": 5, "ranks": 4, "gpus_per_rank": 8,
        "gpu_model": "H100", "min_gpu_memory_mib": 80000, "topology": {"level": "leaf", "mode": "require"},
        "image": "pytorch:24.05", "command": ["torchrun", "train.py"], "env": {"A": "1", "N": 2, "B": True},
        "mounts": [{"source": "/data", "target": "/mnt/data", "read_only": False}],
        "checkpoint_dir": "/ckpt", "checkpoint_signal": "SIGUSR2", "grace_period_s": 60,
        "restart_policy": "rank", "max_restarts": 5, "time_limit_s": 3600.5, "preemptible": False,
    })
    assert spec.total_gpus == 32
    assert spec.topology == Topology(level="leaf", mode="require")
    assert spec.mounts == (Mount(source="/data", target="/mnt/data", read_only=False),)
    assert spec.env == {"A": "1", "N": "2", "B": "true"}  # numbers and booleans become strings
    assert spec.grace_period_s == 60.0 and spec.time_limit_s == 3600.5


def test_shorthands() -> None:
    spec = parse_jobspec({"name": "x", "command": "python train.py --lr 3e-4", "topology": "node"})
    assert spec.command == ("sh", "-c", "python train.py --lr 3e-4")
    assert spec.topology == Topology(level="node", mode="prefer")


def test_every_problem_is_reported_with_its_path() -> None:
    bad = {
        "queue": "",
        "priority": 1.5,
        "ranks": 0,
        "gpus_per_rank": MAX_GPUS_PER_RANK + 1,
        "min_gpu_memory_mib": -1,
        "max_restarts": "3",
        "grace_period_s": -1,
        "time_limit_s": 0,
        "checkpoint_signal": "SIGKILL",
        "restart_policy": "always",
        "preemptible": "yes",
        "command": ["python", 3],
        "env": {"CORRAL_JOB_ID": "x", "OK": "1", "BAD": [1]},
        "mounts": [{"source": "/a", "target": "/b"}, {"source": "rel", "target": "/c", "ro": True}, "x"],
        "topology": {"level": "", "mode": "must"},
        "colour": "blue",
    }
    with pytest.raises(InvalidJobSpec) as e:
        parse_jobspec(bad)
    got = {p.path for p in e.value.problems}
    assert got == {
        "name", "queue", "priority", "ranks", "gpus_per_rank", "min_gpu_memory_mib", "max_restarts",
        "grace_period_s", "time_limit_s", "checkpoint_signal", "restart_policy", "preemptible", "command",
        "env.CORRAL_JOB_ID", "env.BAD", "mounts[1].source", "mounts[1].ro", "mounts[2]", "topology.level",
        "topology.mode", "colour",
    }
    assert all(p.message for p in e.value.problems)
    assert "name: is required" in str(e.value)


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ([], "$"),
        ({"name": "x" * (MAX_NAME_LEN + 1)}, "name"),
        ({"name": "  "}, "name"),
        ({"name": "x", "ranks": MAX_RANKS + 1}, "ranks"),
        ({"name": "x", "ranks": True}, "ranks"),
        ({"name": "x", "gpus_per_rank": 0, "gpu_model": "H100"}, "gpu_model"),
        ({"name": "x", "grace_period_s": float("nan")}, "grace_period_s"),
        ({"name": "x", "topology": 3}, "topology"),
        ({"name": "x", "topology": {"level": "node", "zone": "a"}}, "topology.zone"),
        ({"name": "x", "mounts": {"source": "/a"}}, "mounts"),
        ({"name": "x", "mounts": [{"source": "/a", "target": "/b", "read_only": "no"}]}, "mounts[0].read_only"),
        ({"name": "x", "env": ["A=1"]}, "env"),
        ({"name": "x", "env": {"A=B": "1"}}, "env.A=B"),
    ],
)
def test_single_problems(obj: Any, path: str) -> None:
    assert path in paths(obj)


def test_zero_gpu_ranks_are_valid() -> None:
    assert parse_jobspec({"name": "cpu-eval", "gpus_per_rank": 0}).total_gpus == 0


# --- properties --------------------------------------------------------------------------

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=MAX_NAME_LEN).filter(
    str.strip)
PATHS = st.from_regex(r"/[a-z0-9_/.-]{0,20}", fullmatch=True)
SECONDS = st.floats(min_value=0, max_value=365 * 86400, allow_nan=False)
VALID_SPECS = st.builds(
    JobSpec,
    name=NAMES,
    queue=NAMES,
    priority=st.integers(-1_000_000, 1_000_000),
    ranks=st.integers(1, MAX_RANKS),
    gpus_per_rank=st.integers(1, MAX_GPUS_PER_RANK),
    gpu_model=st.none() | NAMES,
    min_gpu_memory_mib=st.integers(0, 10_000_000),
    topology=st.none() | st.builds(Topology, level=NAMES, mode=st.sampled_from(["require", "prefer"])),
    image=st.none() | NAMES,
    command=st.lists(st.text(max_size=10), max_size=4).map(tuple),
    env=st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
        lambda k: not k.startswith("CORRAL_")), st.text(max_size=10), max_size=3),
    mounts=st.lists(st.builds(Mount, source=PATHS, target=PATHS, read_only=st.booleans()), max_size=2).map(tuple),
    checkpoint_dir=st.none() | PATHS,
    checkpoint_signal=st.sampled_from(CHECKPOINT_SIGNALS),
    grace_period_s=SECONDS,
    restart_policy=st.sampled_from(["never", "rank", "gang"]),
    max_restarts=st.integers(0, 1000),
    time_limit_s=st.none() | SECONDS.filter(bool),
    preemptible=st.booleans(),
)


@settings(max_examples=150)
@given(VALID_SPECS)
def test_valid_specs_parse_back_to_themselves(spec: JobSpec) -> None:
    obj = msgspec.to_builtins(spec)
    assert jobspec_problems(obj) == []
    assert parse_jobspec(obj) == spec


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
# YAML mappings can have non-string keys: `1: x` or `true: y`.
FIELD_NAMES = st.sampled_from([f.name for f in msgspec.structs.fields(JobSpec)]) | st.text(max_size=6) | st.integers()


@settings(max_examples=300)
@given(st.dictionaries(FIELD_NAMES, JSONISH, max_size=8) | JSONISH)
def test_any_input_gives_a_spec_or_problems_never_a_crash(obj: Any) -> None:
    try:
        spec = parse_jobspec(obj)
    except InvalidJobSpec as e:
        assert e.problems and all(isinstance(p.path, str) and p.message for p in e.problems)
        str(e)
    else:
        assert isinstance(spec, JobSpec)


def test_interactive_needs_a_sha256_key_and_a_boolean_pty() -> None:
    """`interactive` (corral run's stdin, README "Interactive jobs"): the log holds the key's hash only."""
    from schemas.jobspec import Interactive

    good = {"name": "i", "command": ["cat"], "interactive": {"pty": True, "key_sha256": "ab" * 32}}
    assert parse_jobspec(good).interactive == Interactive(pty=True, key_sha256="ab" * 32)
    assert parse_jobspec({"name": "i"}).interactive is msgspec.UNSET  # unset: written as before it existed
    bad = {"name": "i", "interactive": {"pty": "yes", "key_sha256": "my-secret-key"}}
    assert {p.path for p in jobspec_problems(bad)} == {"interactive.pty", "interactive.key_sha256"}
    assert [p.path for p in jobspec_problems({"name": "i", "interactive": "pty"})] == ["interactive"]
