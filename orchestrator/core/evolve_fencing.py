"""Fencing in the fold: a scheduler's decision from an epoch older than the newest election is void.

Elections themselves are folded here: epochs go exactly previous + 1. What
"stale" means for each event type, stamped or unstamped, is told in
evolve.py's docstring.
"""

from __future__ import annotations

from orchestrator.core.model.state import ClusterState
from schemas.events import SchedulerElected


def stale(state: ClusterState, event_id: str, epoch: int, *, unstamped_ok: bool) -> bool:
    """Whether a scheduler's decision comes from an epoch older than the newest election; records it void.

    `unstamped_ok`: the event's type gained its epoch with fencing, so 0 is an old or a
    non-scheduler writer's "no epoch" and is not judged here (module docstring).
    """
    if epoch >= state.epoch or (unstamped_ok and epoch == 0):
        return False
    void(state, event_id, f"stale epoch {epoch} < {state.epoch}")
    return True


def void(state: ClusterState, event_id: str, why: str) -> None:
    state.voids += 1
    state.last_void = f"{event_id}: {why}"


def scheduler_elected(state: ClusterState, e: SchedulerElected) -> None:
    """Epochs are exactly previous + 1: two candidates cannot both hold one, and none is skipped."""
    if e.epoch != state.epoch + 1:
        void(state, e.event_id, f"epoch {e.epoch} does not follow {state.epoch} (elections go previous + 1)")
        return
    state.epoch = e.epoch
    state.scheduler_id = e.scheduler_id
    state.policy = e.policy
