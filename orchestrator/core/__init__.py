"""corral's pure scheduler core: state, evolve, decide (no IO, clock or randomness).

Two layers, with the policies between them (model < policies < engine, kept by pyproject.toml's
import-linter contracts): `orchestrator.core.model` holds the state the fold builds and what both the
policies and the engine read of it (capacity, topology, facts, usage, estimates, plan types); every
other module here is the engine (the fold and decide), which may use the policies. Import the modules
themselves (this package imports nothing, so no import cycle runs through it):

    orchestrator.core.model.state    ClusterState (+ snapshot/restore), Job, Node, Queue, ...
    orchestrator.core.evolve   evolve(state, event, seq=0) -> state (in place), fold(events)
    orchestrator.core.decide   decide(state, now, *, epoch, policies=DEFAULT_POLICIES) -> list[Event]
                               decide_cycle(...) -> Decision(events, complete, more) (the simulator's)
    orchestrator.core.node_work  node_work, rank_intent: what an agent runs on its node

A decide cycle's stages, in order: backlog.py, react.py, tentative.py (plan.py), reject.py,
lines.py, admit.py (heads.py, preemption.py, reservations.py, completeness.py), explain.py.
What a cycle derives from the state is kept between calls where rebuilding it
would cost O(nodes) or O(gangs): topology.topology_of, freegpus.py (free GPUs
and capacity indexes) and running.running_gangs -- memos of the state's values,
answered in O(1) for the same state object while the fold's revision counters
(ClusterState.alloc_rev, nodes_rev) stand still. They live in a memo.Memo that
the caller owns and passes to decide (the scheduler service and the simulator
keep one; none: a fresh one per call); one decide at a time per Memo.
"""
