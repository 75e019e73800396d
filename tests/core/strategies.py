"""Hypothesis strategies for random clusters and random event sequences, and the test profiles.

Profiles: CORRAL_CORE_PROFILE=core-fast (default, for shared 2-core boxes) or
core-thorough (nightly / before a release).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.core.harness import DGX1_LINKS

settings.register_profile(
    "core-fast",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "core-thorough",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile(os.environ.get("CORRAL_CORE_PROFILE", "core-fast"))

LEVELS = st.sampled_from([(), ("leaf",), ("block", "leaf")])


@st.composite
def nodes(draw: Any) -> list[dict[str, Any]]:
    count = draw(st.one_of(st.integers(1, 4), st.integers(1, 64)))  # small clusters see contention
    out = []
    for i in range(count):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8, 8, 8]))
        kind = draw(st.sampled_from(["uniform", "none", "dgx1"])) if gpus == 8 else "none"
        links: tuple[tuple[int, ...], ...] = ()
        if kind == "dgx1":
            links = DGX1_LINKS
        elif kind == "uniform":
            links = tuple(tuple(0 if a == b else 118 for b in range(gpus)) for a in range(gpus))
        out.append(
            {
                "node_id": f"n{i:02}",
                "gpus": gpus,
                "model": draw(st.sampled_from(["H100", "A100"])),
                "memory_mib": draw(st.sampled_from([40960, 81920])),
                "labels": {
                    "block": draw(st.sampled_from(["b0", "b1"])),
                    **({"leaf": draw(st.sampled_from(["l0", "l1", "l2"]))} if draw(st.booleans()) else {}),
                },
                "links": links,
            }
        )
    return out


@st.composite
def queues(draw: Any) -> list[dict[str, Any]]:
    count = draw(st.integers(0, 3))
    out: list[dict[str, Any]] = []
    names = ["default", "research", "prod"][:count]
    for name in names:
        out.append(
            {
                "name": name,
                "weight": draw(st.sampled_from([0.5, 1.0, 2.0])),
                "guaranteed_gpus": draw(st.sampled_from([0, 4, 8, 16])),
                "limit_gpus": draw(st.sampled_from([None, None, 8, 24])),
                "parent": "default" if name != "default" and draw(st.booleans()) else None,
            }
        )
    return out


specs = st.fixed_dictionaries(
    {
        "ranks": st.integers(1, 4),
        "gpus_per_rank": st.sampled_from([0, 1, 1, 2, 4, 8]),
        "priority": st.integers(-1, 2),
        "checkpoint_dir": st.just("/ckpt"),
        "queue": st.sampled_from(["default", "research", "research", "prod", "prod", "nope"]),
        "preemptible": st.booleans(),
        "restart_policy": st.sampled_from(["gang", "rank", "never"]),
        "max_restarts": st.integers(0, 2),
        "time_limit_s": st.sampled_from([None, None, 30.0, 300.0]),
        "grace_period_s": st.sampled_from([0.0, 5.0, 30.0]),
    },
    optional={
        # Mostly satisfiable constraints; the impossible ones (B200, rack) exercise rejection.
        "gpu_model": st.sampled_from(["H100", "H100", "A100", "A100", "B200"]),
        "topology": st.sampled_from(
            [("leaf", "require"), ("leaf", "prefer"), ("node", "prefer"), ("block", "require"), ("rack", "prefer")]
        ),
        "min_gpu_memory_mib": st.sampled_from([0, 0, 50000]),
    },
)

_submit = st.tuples(st.just("submit"), specs)
_burst = st.tuples(st.just("burst"), st.lists(specs, min_size=2, max_size=8))
_decide = st.tuples(st.just("decide"))
_agents = st.tuples(st.just("agents"))
_finish = st.tuples(st.just("finish"), st.integers(0, 1000))
_tick = st.tuples(st.just("tick"), st.sampled_from([1.0, 10.0, 45.0, 400.0]))

#: Weighted by repetition: mostly the happy path, with every kind of trouble mixed in.
ops = st.one_of(
    _submit, _submit, _burst, _burst,
    _decide, _decide, _decide, _decide,
    _agents, _agents, _agents,
    _finish, _finish,
    _tick, _tick, _tick,
    st.tuples(st.just("crash"), st.integers(0, 1000), st.booleans()),
    st.tuples(st.just("lose"), st.integers(0, 1000)),
    st.tuples(st.just("node_fail"), st.integers(0, 1000)),
    st.tuples(st.just("node_recover"), st.integers(0, 1000)),
    st.tuples(st.just("cordon"), st.integers(0, 1000), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("checkpoint"), st.integers(0, 1000), st.integers(0, 3)),
    st.tuples(st.just("stale")),
    st.tuples(st.just("race")),
    st.tuples(st.just("dup")),
    st.tuples(st.just("reregister"), st.integers(0, 1000), st.sampled_from([0, 4, 8])),
)


#: Contention: a few full-size nodes, two teams with guarantees, wide priorities, plain specs.
tight_specs = st.fixed_dictionaries(
    {
        "ranks": st.integers(1, 2),
        "gpus_per_rank": st.sampled_from([1, 2, 2, 4, 4, 8]),
        "priority": st.integers(0, 3),
        "queue": st.sampled_from(["a", "b"]),
        "preemptible": st.sampled_from([True, True, True, False]),
        "restart_policy": st.sampled_from(["gang", "never"]),
        "max_restarts": st.integers(0, 1),
        "time_limit_s": st.sampled_from([None, 100.0, 1000.0]),
        "grace_period_s": st.sampled_from([5.0, 30.0]),
        "checkpoint_dir": st.just("/ckpt"),
    }
)
_tight_burst = st.tuples(st.just("burst"), st.lists(tight_specs, min_size=1, max_size=6))
tight_ops = st.one_of(
    _tight_burst, _tight_burst,
    _decide, _decide, _decide, _decide,
    _agents, _agents, _agents,
    _finish, _finish,
    st.tuples(st.just("tick"), st.sampled_from([10.0, 30.0, 60.0])),
    st.tuples(st.just("checkpoint"), st.integers(0, 1000), st.integers(0, 3)),
    st.tuples(st.just("crash"), st.integers(0, 1000), st.booleans()),
    st.tuples(st.just("node_fail"), st.integers(0, 1000)),
    st.tuples(st.just("node_recover"), st.integers(0, 1000)),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("race")),
    st.tuples(st.just("stale")),
)
