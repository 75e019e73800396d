"""`decide(state, now)`: what the scheduler appends next. Pure; never mutates `state`.

Read it like Kueue's scheduling cycle: numbered stages, each a small function
in its own module, over a tentative plan that is dropped when the call ends.
The returned events are meant to be appended in order; folded in that order
they are all valid (a GangReserved only uses GPUs that are free once the
follow-ups before it are folded).
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.core.admit import admit
from orchestrator.core.backlog import Backlog
from orchestrator.core.cycle import Cycle
from orchestrator.core.explain import explain
from orchestrator.core.lines import queue_lines
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.plan import Plan
from orchestrator.core.model.state import ClusterState
from orchestrator.core.model.topology import topology_of
from orchestrator.core.react import react
from orchestrator.core.reject import Rejecter, reject_unreadable
from orchestrator.core.reserved_nodes import reject_unreservable
from orchestrator.core.tentative import tentative_plan
from orchestrator.core.updates import answer_updates
from orchestrator.policies import DEFAULT_POLICIES, Policies
from schemas.events import Event, JobRunning


class Decision(NamedTuple):
    events: list[Event]
    #: Admission ran and is complete (admit.Admitted, completeness.py): folding `events` and the workers' WorkerStarted
    #: answers, a call at the same `now` may pass `after_complete` and skip it.
    complete: bool
    #: New jobs were left for the next calls to explain (core/backlog.py), or admission stopped at
    #: its cap (`Policies.placements_per_cycle`), or follow-ups were left for the next calls
    #: (`Policies.followups_per_cycle`, core/react.py): call again even if `events` changes nothing
    #: that would wake a caller (a first JobWaiting or a JobRunning changes nothing else).
    more: bool = False


def decide(state: ClusterState, now: float, *, epoch: int, policies: Policies = DEFAULT_POLICIES,
           memo: Memo | None = None) -> list[Event]:
    """`memo`: what the caller keeps between calls over the same evolving state (memo.py); None: a fresh one."""
    return decide_cycle(state, now, epoch=epoch, policies=policies, memo=memo).events


def decide_cycle(state: ClusterState, now: float, *, epoch: int, policies: Policies = DEFAULT_POLICIES,
                 after_complete: bool = False, memo: Memo | None = None) -> Decision:
    """`decide`, telling whether its admission was complete.

    `after_complete` is the caller's word that `state` is the state of a call at this same
    `now` that returned `complete`, with that call's events and the WorkerStarted answers to
    them folded, and nothing else. Admission is then skipped unless the follow-ups do more
    than mark gangs running or new jobs wait for a first verdict: the answer is the same
    (the simulator calls it so after each placement; its strict mode compares).
    """
    if epoch < state.epoch:
        return Decision([], False)  # a deposed leader decides nothing; its events would be void anyway
    if memo is None:
        memo = Memo()
    topo = topology_of(state, memo)
    c = Cycle(state=state, now=now, epoch=epoch, policies=policies, topo=topo, memo=memo)
    backlog = Backlog.of(state, now, policies.fresh_per_cycle)
    # 1. React: follow-ups the log already implies (running, completed, restarted,
    #    requeued, preempted, stopped, cancelled). Past `followups_per_cycle` the rest wait for
    #    the next cycles and this one decides nothing else: admission waits until its plan
    #    knows every GPU the follow-ups free (a carried completion's GPUs look busy to it).
    reaction = react(c, backlog.stopping)
    followups = reaction.events
    if reaction.capped:
        return Decision(followups, False, True)
    #    ... and the answer to each submission no one can read: a rejection with why.
    unreadable: list[Event] = [*reject_unreadable(c)] if c.state.unreadable_submissions else []
    #    ... the answers to `corral update` (core/updates.py), and the rejection of jobs naming a node
    #    reservation they can never run in (core/reserved_nodes.py).
    unreadable += answer_updates(c) if c.state.update_asks else []
    unreadable += reject_unreservable(c, backlog.fresh)
    if after_complete and not backlog.fresh and all(isinstance(e, JobRunning) for e in followups):
        return Decision([*followups, *unreadable], True)  # stages 2-6 would decide nothing more (completeness.complete)
    # 2. Tentative plan: free GPUs per node and domain, queue usage -- with the GPUs
    #    the follow-ups release already free.
    plan: Plan = tentative_plan(c, followups)
    # 3. Reject: pending specs that can never fit this cluster (a bounded batch of the new jobs
    #    now; a new job past it when its line offers it as a head: backlog.py).
    rejecter = Rejecter(c, plan, backlog.fresh)
    # 4. Heads: each queue's line of pending jobs (priority, claim, waiting since, id: kept sorted by the fold).
    lines = queue_lines(c, plan, rejecter.admissible if backlog.more else None)
    # 5. Admit in fair-share order: allocate, else preempt / reclaim, else hold a
    #    backfill reservation for the first blocked gang, else wait (quota, backfill, capacity).
    admitted = admit(c, plan, lines)
    # 6. Explain: a JobWaiting for each job left pending whose reason changed.
    #    (A cycle whose admission stopped at its cap tells the new jobs it did not judge nothing:
    #    the next call goes on at once and may place them, and a burst would otherwise write a
    #    JobWaiting for jobs placed in the same instant. They stay new; the memo keeps their
    #    checks passed (reject.py), so the next calls do not pay them again.)
    waiting = explain(c, plan, [] if admitted.capped else backlog.fresh, admitted.outcomes)
    more = backlog.more or admitted.capped
    events = [*followups, *unreadable, *rejecter.events, *admitted.events, *waiting]
    return Decision(events, admitted.complete and not more, more)
