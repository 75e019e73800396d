"""Trace-driven simulator: the production scheduler core on a virtual clock.

`simulate(scenario, policy)` feeds JobSubmitted, node and worker events to
the real `evolve`/`decide` (orchestrator.core) in virtual time and plays the
node agents; `run_policies` compares several policy sets on one scenario.
Randomness lives only in `gen` (seeded); everything else is deterministic.
The command line (`corral sim`, `corral sim gen`) is orchestrator/cli/sim.py; this library never
imports the CLI.
"""

from orchestrator.sim.baselines import POLICY_NAMES, policies_for
from orchestrator.sim.cluster import ClusterSpec, load_cluster, parse_cluster, setup_events
from orchestrator.sim.engine import Scenario, SimConfig, SimResult, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.metrics import summarize
from orchestrator.sim.replay import fold_log, from_log, read_log
from orchestrator.sim.runs import run_policies
from orchestrator.sim.specs import SimJob, sim_jobs
from orchestrator.sim.trace import Trace, TraceError, TraceJob, load_trace

__all__ = [
    "POLICY_NAMES",
    "ClusterSpec",
    "GenConfig",
    "Scenario",
    "SimConfig",
    "SimJob",
    "SimResult",
    "Trace",
    "TraceError",
    "TraceJob",
    "fold_log",
    "from_log",
    "generate",
    "load_cluster",
    "load_trace",
    "parse_cluster",
    "policies_for",
    "read_log",
    "run_policies",
    "setup_events",
    "sim_jobs",
    "simulate",
    "standard_cluster",
    "summarize",
]
