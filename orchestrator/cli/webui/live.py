"""One live projection per UI process, fanned out to every open browser.

The log is followed once (the shared Follower, as `corral top` does), never
once per browser. A broadcaster turns what changed into one message at most
every `interval` seconds (coalescing bursts), encodes it once, and hands the
same bytes to every client: the cluster's small parts whole (nodes, queues),
the job table as a delta (the rows of the jobs the events touched, and the
ids that left it). A client that falls behind gets its backlog dropped and a
fresh full view instead, so a slow browser costs memory bounded by
MAX_BACKLOG messages and never slows the fold or the other clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from events.bus import Envelope
from events.follow import Follower
from events.logsource import LogSource
from events.swallowed_cancel import stop_if_cancelled
from orchestrator.cli.datasets_view import names_by_key
from orchestrator.cli.render import line
from orchestrator.cli.webui.payloads import (
    cluster_payload,
    job_row,
    node_entry,
    node_payload,
    node_refs,
    shown_job_ids,
    touched_jobs,
)
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState

#: Recent log lines the cluster page lists.
RECENT_EVENTS = 20
#: Fair-share samples kept (one per SAMPLE_EVERY_S of log time: an hour at 5 s).
SAMPLES_KEPT = 720
SAMPLE_EVERY_S = 5.0
#: Messages a client may lag behind before its backlog is replaced by one full view.
MAX_BACKLOG = 32

_encode = msgspec.json.Encoder().encode


class Client:
    """One open browser: the messages not yet written to it (bytes shared with every other client)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def offer(self, message: bytes) -> None:
        if self.queue.qsize() >= MAX_BACKLOG:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)  # None: send a full view now (the deltas it missed are gone)
            return
        self.queue.put_nowait(message)


class LiveView:
    """The cluster followed from `state` (folded up to its seq) and sent to every client as it changes."""

    def __init__(self, bus: LogSource, state: ClusterState, recent: Iterable[Envelope] = (), *,
                 interval: float = 0.25) -> None:
        self.follower = Follower(bus, evolve, state)
        self.follower.on_event(self._saw)
        self.interval = interval
        self.clients: set[Client] = set()
        self._recent: deque[str] = deque((line(e) for e in recent), maxlen=RECENT_EVENTS)
        #: Events folded since the last broadcast (the newest RECENT_EVENTS: formatted only when sent).
        self._new: deque[Envelope] = deque(maxlen=RECENT_EVENTS)
        self._touched: set[str] = set()
        self._shown: set[str] = shown_job_ids(state)
        #: What each node's entry was last sent from (payloads.node_refs): a node is sent again when it changed.
        self._node_refs: dict[str, tuple[object, ...]] = {n.node_id: node_refs(state, n) for n in state.nodes.values()}
        self._samples: deque[dict[str, Any]] = deque(maxlen=SAMPLES_KEPT)
        self._last_sample = 0.0
        self._full: tuple[int, bytes] | None = None
        #: Messages built and bytes handed to clients (the bench reads them).
        self.messages = 0
        self.bytes_sent = 0

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    def now(self) -> float:
        """The stream's time as the events read prove it (events/streamclock.py), else this machine's."""
        now = self.follower.clock.now()
        return now if now is not None else time.time()

    def _saw(self, env: Envelope) -> None:
        self._new.append(env)
        self._touched.update(touched_jobs(env.subject, env.event))

    async def run(self) -> None:
        """Follow the log and broadcast until cancelled; the follower's failure (a LogGap) ends it."""
        follow = asyncio.create_task(self.follower.follow(), name="ui-follow")
        try:
            while not follow.done():
                stop_if_cancelled()  # a stop a nats wait swallowed (events/swallowed_cancel.py)
                await self.follower.wait_changed(SAMPLE_EVERY_S)
                self.follower.changed.clear()
                self.broadcast()
                await asyncio.sleep(self.interval)
            follow.result()
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow

    def _sample(self, cluster: dict[str, Any], now: float, *, force: bool = False) -> dict[str, Any] | None:
        if not force and now - self._last_sample < SAMPLE_EVERY_S:
            return None
        self._last_sample = now
        sample = {"t": now, "queues": {q["queue"]: [q["gpus"], q["share"]] for q in cluster["queues"]}}
        self._samples.append(sample)
        return sample

    def broadcast(self) -> None:
        """One message with what changed since the last, to every client (nothing when nothing did)."""
        state, now = self.state, self.now()
        cluster = cluster_payload(state, now)
        sample = self._sample(cluster, now, force=not self._samples)
        lines = [line(env) for env in self._new]
        self._new.clear()
        self._recent.extend(lines)
        shown = shown_job_ids(state)
        changed = (self._touched | set(state.gated) | (shown - self._shown)) & shown
        gone = sorted(self._shown - shown)
        self._touched.clear()
        self._shown = shown
        nodes = self._changed_nodes(state)
        nodes_gone = sorted(set(self._node_refs) - set(state.nodes))
        for node_id in nodes_gone:
            del self._node_refs[node_id]
        if not lines and not changed and not gone and not nodes and not nodes_gone and sample is None:
            return
        delta = {"kind": "delta", "seq": state.seq, "now": now, "cluster": cluster,
                 "jobs": [job_row(state, state.jobs[j]) for j in changed], "gone": gone,
                 "nodes": nodes, "nodes_gone": nodes_gone, "events": lines, "sample": sample}
        message = sse("delta", _encode(delta))
        self.messages += 1
        for client in self.clients:
            client.offer(message)
            self.bytes_sent += len(message)

    def _changed_nodes(self, state: ClusterState) -> list[dict[str, Any]]:
        """The entries of the nodes that changed since the last broadcast (all of them at first)."""
        changed = []
        for node in state.nodes.values():
            refs = node_refs(state, node)
            old = self._node_refs.get(node.node_id)
            if old is None or any(a is not b for a, b in zip(old, refs, strict=True)):
                self._node_refs[node.node_id] = refs
                changed.append(node)
        if not changed:
            return []
        names = names_by_key(state) if any(n.datasets for n in changed) else {}
        return [node_entry(state, n, names) for n in changed]

    def full(self) -> bytes:
        """The whole live view as one message (a new client's first; one that fell behind), built once per
        position."""
        state = self.state
        if self._full is not None and self._full[0] == state.seq:
            return self._full[1]
        now = self.now()
        cluster = cluster_payload(state, now)
        if not self._samples:
            self._sample(cluster, now, force=True)
        body = {"kind": "full", "seq": state.seq, "now": now, "cluster": cluster, "nodes": node_payload(state),
                "jobs": [job_row(state, state.jobs[j]) for j in sorted(self._shown, key=_submit_order(state))],
                "events": list(self._recent), "samples": list(self._samples)}
        self._full = (state.seq, sse("full", _encode(body)))
        return self._full[1]

    def overview(self) -> bytes:
        """The full view as plain JSON (`GET /api/overview`)."""
        return self.full().split(b"data: ", 1)[1].rstrip(b"\n")


def _submit_order(state: ClusterState) -> Any:
    return lambda jid: state.jobs[jid].submit_seq if jid in state.jobs else 0


def sse(event: str, data: bytes) -> bytes:
    """One server-sent event (the JSON holds no newline: msgspec writes it compact)."""
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
