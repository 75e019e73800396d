"""The web UI's HTTP server (aiohttp): the static pages, the live stream, and a few read-only JSON answers.

Who may read it is access.py's; how a query is read, queries.py's. Every
failure is a status and one line of JSON (`_errors`): no response ever
carries a traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from importlib.resources import files
from typing import Any

import structlog
from aiohttp import web

from events.bus import Bus
from events.swallowed_cancel import stop_if_cancelled
from orchestrator.cli.errors import FAILURE, NOT_FOUND, TIMEOUT, UNREACHABLE, USAGE, CliError
from orchestrator.cli.timeline import pending_by_reason, runs, story_summary
from orchestrator.cli.views import job_estimate
from orchestrator.cli.webui.access import Access, Handler, check_access, error, guard, json_response, security_headers
from orchestrator.cli.webui.history import NoHistory, history
from orchestrator.cli.webui.live import Client, LiveView
from orchestrator.cli.webui.payloads import cluster_payload, job_page, job_row, node_payload
from orchestrator.cli.webui.queries import (
    BadRequest,
    duration_param,
    int_param,
    job_id_param,
    params,
    states_param,
)
from orchestrator.core.gating import gate_reason
from orchestrator.core.model.state import ClusterState, Job

log = structlog.get_logger("corral.ui")

#: Static files served, by name (nothing else under /static/ is).
STATIC = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
#: A comment line on an idle live stream this often keeps proxies from closing it and finds closed browsers.
PING_S = 15.0
#: Most bytes of a rank's log the job page shows (its tail).
LOG_TAIL_MAX = 64 * 1024
#: Most buckets a history chart asks for.
MAX_BUCKETS = 200


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as a status and one line of JSON; never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except BadRequest as e:
        return error(400, str(e))
    except NoHistory as e:
        return error(503, str(e))
    except CliError as e:
        status = {USAGE: 400, NOT_FOUND: 404, UNREACHABLE: 503, TIMEOUT: 504}.get(e.code, 500)
        return error(status, str(e))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:
        log.error("ui_request_failed", path=request.path, error=repr(e))
        return error(500, f"internal error: {type(e).__name__} (the UI's log has it)")


# --- the application ---------------------------------------------------------------------------


class UI:
    """The routes, over one live view and the bus it follows."""

    def __init__(self, bus: Bus, live: LiveView, access: Access) -> None:
        self.bus = bus
        self.live = live
        self.access = access
        root = files("orchestrator.cli.webui") / "static"
        self.static = {name: (root / name).read_bytes() for name in STATIC}
        self._streams: set[asyncio.Task[Any]] = set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors, guard(self.access)], client_max_size=4096)
        app.on_response_prepare.append(security_headers)
        app.router.add_get("/", self.index)
        app.router.add_get("/static/{name}", self.static_file)
        app.router.add_get("/api/live", self.stream)
        app.router.add_get("/api/overview", self.overview)
        app.router.add_get("/api/jobs", self.jobs)
        app.router.add_get("/api/job/{job_id}", self.job)
        app.router.add_get("/api/job/{job_id}/log", self.rank_log)
        app.router.add_get("/api/history", self.history)
        app.router.add_get("/api/at", self.at)
        return app

    def close_streams(self) -> None:
        """End every live stream now: a stopping server would otherwise wait for them (they never end)."""
        for task in list(self._streams):
            task.cancel()

    async def index(self, request: web.Request) -> web.Response:
        params(request, ())
        return web.Response(body=self.static["index.html"], content_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    async def static_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            return error(404, f"no file {name!r}")
        return web.Response(body=self.static[name], content_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the full view, then a delta whenever the log changes (live.py)."""
        params(request, ())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        client = Client()
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        self.live.clients.add(client)
        try:
            await resp.write(self.live.full())
            while True:
                try:
                    message = await asyncio.wait_for(client.queue.get(), PING_S)
                except TimeoutError:
                    await resp.write(b": ping\n\n")
                    continue
                await resp.write(self.live.full() if message is None else message)
        except ConnectionResetError:
            pass  # the browser went away (found by the next write or ping)
        finally:
            self.live.clients.discard(client)
            self._streams.discard(task)
        return resp

    async def overview(self, request: web.Request) -> web.Response:
        params(request, ())
        return web.Response(body=self.live.overview(), content_type="application/json")

    async def jobs(self, request: web.Request) -> web.Response:
        """Jobs the live view holds, filtered; `history=1`: every job the index holds in the filters."""
        p = params(request, ("state", "queue", "user", "limit", "history", "since"))
        states = states_param(p)
        limit = int_param(p, "limit", 500, 1, 5000)
        if p.get("history", "0") not in ("0", "1"):
            raise BadRequest(f"history={p['history']!r}: 0 or 1")
        for key in ("queue", "user"):
            if key in p and (not p[key] or len(p[key]) > 128):
                raise BadRequest(f"{key}= must be 1 to 128 characters")
        if p.get("history") == "1":
            return json_response(await self._indexed_jobs(p, states, limit))
        state = self.live.state
        rows = [job_row(state, j) for j in state.jobs.values()
                if (not states or j.status in states) and (p.get("user") in (None, j.submitted_by))]
        if "queue" in p:
            rows = [r for r in rows if r["queue"] == p["queue"]]
        return json_response({"seq": state.seq, "jobs": rows[-limit:]})

    async def _indexed_jobs(self, p: dict[str, str], states: frozenset[str], limit: int) -> dict[str, Any]:
        from orchestrator.cli.indexed import job_of
        from orchestrator.cli.webui.history import index_answer
        from orchestrator.index import api

        since = self.live.now() - duration_param(p, "since", 7 * 86400.0)
        reply = await index_answer(self.bus, api.JOBS, api.JobsRequest(
            since=since, states=sorted(states), queue=p.get("queue"), user=p.get("user"),
            limit=min(limit, api.MAX_LIMIT)), api.JobsReply)
        empty = ClusterState()
        return {"seq": reply.as_of_seq, "jobs": [job_row(empty, job_of(info)) for info in reply.jobs],
                "more": reply.next_after is not None}

    async def _find_job(self, job_id: str) -> tuple[ClusterState, Job]:
        """The live fold's record of the job, else the index's (one finished before the fold's newest)."""
        state = self.live.state
        found = state.jobs.get(job_id)
        if found is not None:
            return state, found
        from orchestrator.cli.indexed import job_of
        from orchestrator.cli.webui.history import index_answer
        from orchestrator.index import api

        try:
            reply = await index_answer(self.bus, api.JOB, api.JobRequest(job_id=job_id), api.JobReply)
        except NoHistory:
            reply = None
        if reply is None or reply.job is None:
            raise CliError(f"unknown job {job_id!r}", NOT_FOUND)
        return ClusterState(), job_of(reply.job)

    async def job(self, request: web.Request) -> web.Response:
        """The job page: its record (`corral job`), its story (`corral explain`), ranks and nodes."""
        from orchestrator.cli.forensics import job_story

        params(request, ())
        job_id = job_id_param(request)
        state, found = await self._find_job(job_id)
        now = self.live.now()
        page = job_page(state, found, now)
        story = await job_story(self.bus, job_id, use_index=True, state=self.live.state)
        entries = []
        for run in runs(story.entries):
            e = run.first
            entries.append({"seq": e.seq, "time": e.time, "type": e.type, "text": e.text, "void": e.void,
                            "told": run.told, "last_time": run.last.time, "last_text": run.last.text})
        job_now = story.state.jobs.get(job_id)
        page["story"] = {
            "summary": story_summary(story.job, job_id, story.entries),
            "pending_s": pending_by_reason(story.entries, story.end),
            "gate": gate_reason(story.state, job_now) if job_now is not None else None,
            "estimate": (job_estimate(story.state, story.job, story.end) or {}).get("text")
            if story.job is not None else None,
            "entries": entries,
        }
        return json_response(page)

    async def rank_log(self, request: web.Request) -> web.Response:
        """The tail of one rank's output, asked of its node's agent (`corral logs`)."""
        from orchestrator.cli.logs import ask
        from schemas.logs import LogRequest

        p = params(request, ("rank", "bytes"))
        job_id = job_id_param(request)
        rank = int_param(p, "rank", 0, 0, 1_000_000)
        size = int_param(p, "bytes", 8192, 1, LOG_TAIL_MAX)
        _, found = await self._find_job(job_id)
        node = next((rp.node_id for rp in found.placement if rp.rank == rank), None)
        if node is None:
            raise CliError(f"{job_id} has no rank {rank} placed on a node", NOT_FOUND)
        head = await ask(self.bus, node, LogRequest(job_id=job_id, attempt=found.attempt, rank=rank, limit=1))
        if head.error:
            return json_response({"node": node, "rank": rank, "attempt": found.attempt, "error": head.error})
        start = max(0, head.size - size)
        chunk = await ask(self.bus, node, LogRequest(job_id=job_id, attempt=found.attempt, rank=rank,
                                                    restarts=head.restarts, offset=start, limit=size))
        return json_response({"node": node, "rank": rank, "attempt": found.attempt, "path": chunk.path,
                               "from": start, "size": chunk.size, "running": chunk.running,
                               "text": chunk.data.decode(errors="replace"), "error": chunk.error or None})

    async def history(self, request: web.Request) -> web.Response:
        p = params(request, ("window", "buckets"))
        window = duration_param(p, "window", 86400.0)
        buckets = int_param(p, "buckets", 24, 1, MAX_BUCKETS)
        until = self.live.now()
        capacity = sum(len(o) for o in self.live.state.owners.values())
        return json_response(await history(self.bus, since=until - window, until=until, buckets=buckets,
                                            capacity=capacity))

    async def at(self, request: web.Request) -> web.Response:
        """The cluster at a past moment (`corral replay --at`)."""
        from orchestrator.cli.position import resolve_at
        from orchestrator.cli.state_view import load_state

        p = params(request, ("at",))
        text = p.get("at", "").strip()
        if not text or len(text) > 64:
            raise BadRequest("at= is required: a position (#123), a duration before now (10m), or an ISO time")
        try:
            position = await resolve_at(self.bus, text)
        except ValueError as e:
            raise BadRequest(f"at={text!r}: {e}") from None
        state = await load_state(self.bus, to_seq=position.seq)
        return json_response({"at": position.time, **cluster_payload(state, position.time),
                               "nodes": node_payload(state)})


async def recent_events(bus: Bus, seq: int, n: int) -> list[Any]:
    from contextlib import aclosing

    if seq < 1:
        return []
    out: list[Any] = []
    async with aclosing(bus.replay(from_seq=max(1, seq - n + 1), to_seq=seq)) as batches:
        async for batch in batches:
            out.extend(batch)
    return out[-n:]


async def serve(bus: Bus, access: Access, *, on_ready: Callable[[str], None], fallback_port: bool = False) -> None:
    """Fold the log once, listen, call `on_ready(url)`, and serve until cancelled. `fallback_port`: when the
    port is taken, take any free one (`corral up`, whose UI must not stop the cluster from starting)."""
    from orchestrator.cli.state_view import load_state
    from orchestrator.cli.webui.live import RECENT_EVENTS

    check_access(access)
    started = time.monotonic()
    state = await load_state(bus)
    live = LiveView(bus, state, await recent_events(bus, state.seq, RECENT_EVENTS))
    # `corral up` stopping while the UI reads the log (a demo refused at once): a nats wait may have swallowed
    # the cancel, and a UI started then would serve on and hold `corral up` open (events/swallowed_cancel.py).
    stop_if_cancelled()
    ui = UI(bus, live, access)
    runner = web.AppRunner(ui.app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, access.listen, access.port, ssl_context=access.ssl, shutdown_timeout=2.0)
        try:
            await site.start()
        except OSError as e:
            if not fallback_port or access.port == 0:
                raise CliError(f"the UI cannot listen on {access.listen}:{access.port}: {e.strerror or e}",
                               FAILURE) from None
            site = web.TCPSite(runner, access.listen, 0, ssl_context=access.ssl, shutdown_timeout=2.0)
            await site.start()
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        log.info("ui_listening", host=host, port=port, folded=state.seq, took_s=round(time.monotonic() - started, 3))
        on_ready(f"{access.scheme}://{shown}:{port}/")
        await live.run()
    finally:
        ui.close_streams()
        await runner.cleanup()
