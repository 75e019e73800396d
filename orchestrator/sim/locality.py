"""What locality-aware placement buys (issue #33): one scenario with and without the warm-node preference.

Both runs are the same policy on the same scenario and staging model
(engine.SimConfig: bandwidth, cache size); only `Policies.prefer_warm`
differs, so the difference in JCT is the preference's: jobs placed on nodes
that hold their datasets start without staging them, and keep the caches
others will hit.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple

from orchestrator.sim.baselines import policies_for
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.metrics import summarize
from orchestrator.sim.table import side_by_side

#: Column names of the two runs.
WARM = "{policy}"
COLD = "{policy} (no locality)"


class Comparison(NamedTuple):
    policy: str
    #: summarize() of the run with the preference, and without.
    warm: dict[str, Any]
    cold: dict[str, Any]

    def figures(self) -> dict[str, Any]:
        """The key figures as one flat JSON-ready object."""
        def fig(m: dict[str, Any], *path: str) -> float | None:
            v: Any = m
            for p in path:
                v = v.get(p) if isinstance(v, dict) else None
            return round(v, 4) if isinstance(v, (int, float)) and math.isfinite(v) else None

        out: dict[str, Any] = {"policy": self.policy, "jobs": self.warm["jobs"]}
        for name, m in (("locality", self.warm), ("no_locality", self.cold)):
            out[name] = {
                "completed": m["completed"],
                "avg_jct_h": _h(fig(m, "jct_s", "avg")),
                "p95_jct_h": _h(fig(m, "jct_s", "p95")),
                "avg_queueing_h": _h(fig(m, "queueing_delay_s", "avg")),
                "avg_staging_min": _min(fig(m, "staging", "avg_per_attempt_s")),
                "gpu_h_staging": fig(m, "staging", "gpu_hours_idle"),
                "cache_hit_rate": fig(m, "staging", "cache_hit_rate"),
                "tb_staged": fig(m, "staging", "tb_staged"),
                "evictions": fig(m, "staging", "evictions"),
            }
        w, c = out["locality"]["avg_jct_h"], out["no_locality"]["avg_jct_h"]
        out["avg_jct_no_locality_over_locality"] = round(c / w, 4) if w and c is not None else None
        return out

    def table(self) -> str:
        t = side_by_side({WARM.format(policy=self.policy): self.warm, COLD.format(policy=self.policy): self.cold})
        f = self.figures()
        ratio = f["avg_jct_no_locality_over_locality"]
        line = (f"avg JCT without locality / with: {ratio:.3f}" if ratio is not None else "avg JCT: no job completed")
        return f"{t}\n\n{line}"


def _h(v: float | None) -> float | None:
    return None if v is None else round(v / 3600.0, 4)


def _min(v: float | None) -> float | None:
    return None if v is None else round(v / 60.0, 3)


def compare_locality(scenario: Scenario, policy: str = "corral", config: SimConfig | None = None) -> Comparison:
    """`policy` on `scenario` with placement's warm-node preference, then without it."""
    base = policies_for(policy)
    warm = simulate(scenario, policy, config, policies=replace(base, prefer_warm=True))
    cold = simulate(scenario, policy, config, policies=replace(base, prefer_warm=False))
    return Comparison(policy, summarize(warm), summarize(cold))
