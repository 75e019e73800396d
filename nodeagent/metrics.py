"""Prometheus metrics of the node agents (the readers' shared ones and the endpoint: events/telemetry.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from events.telemetry import ServiceRegistry, count_folded, fold_gauges, gauge
from orchestrator.core.node_view import view_bytes

if TYPE_CHECKING:
    from nodeagent.agent import Agent


class AgentCollector:
    """Per-node worker counts of the agents in this process, and where each one's fold is."""

    def __init__(self, agents: Sequence[Agent]) -> None:
        self._agents = agents

    def collect(self) -> Iterable[Metric]:
        workers = gauge("corral_agent_workers", "Workers an agent runs now", ["node"])
        for agent in self._agents:
            workers.add_metric([agent.node_id], len(agent.workers))
        return [workers, *fold_gauges(((a.node_id, a.follower.state) for a in self._agents), view_bytes)]


def watch_agents(registry: CollectorRegistry, agents: Sequence[Agent]) -> None:
    """Register the gauges of the agents run in this process and count what each one folds.

    Call before the agents run so their catch-up is counted too.
    """
    if not agents:
        return
    for agent in agents:
        count_folded(agent.follower, f"agent/{agent.node_id}")
        if isinstance(registry, ServiceRegistry):  # /readyz: 503 until it folded the log as of its start
            registry.require_caught_up(f"agent/{agent.node_id}", agent.follower)
    registry.register(AgentCollector(agents))
