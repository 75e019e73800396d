"""The web UI's HTTP server (aiohttp): the static pages, the live stream, and a few read-only JSON answers.

Security, in this order: it listens on 127.0.0.1 unless told otherwise, and
anywhere else only with a token (`check_access` refuses to start without
one; TLS is optional on top). With a token every request needs it: an
`Authorization: Bearer` header, or `?token=` once, which sets an HttpOnly,
SameSite=Strict cookie holding an HMAC of the token (never the token), and
redirects to the same page without it. On loopback without a token, a
request whose Host is not a loopback name is refused (403), so a web page
elsewhere cannot reach it by rebinding DNS to 127.0.0.1. Nothing writes: every
route is a GET. Bad query parameters get 400 and a one-line JSON message,
and no response ever carries a traceback.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import msgspec
import structlog
from aiohttp import web

from events.bus import Bus
from events.subjects import InvalidId, check_id
from orchestrator.cli.errors import FAILURE, NOT_FOUND, TIMEOUT, UNREACHABLE, USAGE, CliError
from orchestrator.cli.timeline import pending_by_reason, runs, story_summary
from orchestrator.cli.timespec import parse_duration
from orchestrator.cli.views import STATUSES, job_estimate
from orchestrator.cli.webui.history import NoHistory, history
from orchestrator.cli.webui.live import Client, LiveView
from orchestrator.cli.webui.payloads import cluster_payload, job_page, job_row, node_payload
from orchestrator.core.gating import gate_reason
from orchestrator.core.model.state import ClusterState, Job

log = structlog.get_logger("corral.ui")

#: Static files served, by name (nothing else under /static/ is).
STATIC = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
COOKIE = "corral_ui"
#: A comment line on an idle live stream this often keeps proxies from closing it and finds closed browsers.
PING_S = 15.0
#: Most bytes of a rank's log the job page shows (its tail).
LOG_TAIL_MAX = 64 * 1024
#: The longest history window and most buckets a chart asks for.
MAX_WINDOW_S = 400 * 86400.0
MAX_BUCKETS = 200
_json = msgspec.json.Encoder()
_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class BadRequest(Exception):
    """A query the UI cannot answer as asked: 400 with this message."""


@dataclass(frozen=True)
class Access:
    """Where the UI listens and who may read it."""

    listen: str = "127.0.0.1"
    port: int = 8470
    token: str | None = None
    ssl: ssl.SSLContext | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.ssl is not None else "http"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: Shortest token accepted: a guessable one protects nothing.
MIN_TOKEN = 16


def check_access(access: Access) -> None:
    """Refuse to listen off loopback without a token (CliError, exit 2), and a token too short to protect."""
    if access.token is not None and len(access.token) < MIN_TOKEN:
        raise CliError(f"the UI token is {len(access.token)} characters: use {MIN_TOKEN} or more "
                       "(e.g. `openssl rand -hex 16 > token`)", USAGE)
    if not is_loopback(access.listen) and access.token is None:
        raise CliError(f"listening on {access.listen} (not loopback) needs a token: --token-file FILE or "
                       "CORRAL_UI_TOKEN (and --https-cert/--https-key for TLS), or listen on 127.0.0.1", USAGE)


def _cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"corral-ui-cookie", hashlib.sha256).hexdigest()


def _host_name(host: str) -> str:
    """`127.0.0.1:8470` -> `127.0.0.1`, `[::1]:8470` -> `::1`."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json_response({"error": message}, status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guard(access: Access) -> Any:
    cookie = _cookie_value(access.token) if access.token else None

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return _error(405, "the corral UI is read-only: only GET")
        if access.token is None:
            if not is_loopback(_host_name(request.host)):
                return _error(403, f"Host {request.host!r} is not this loopback server's name")
            return await handler(request)
        assert cookie is not None
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else None
        if given is not None and hmac.compare_digest(given.encode(), access.token.encode()):
            return await handler(request)
        if hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), cookie.encode()):
            return await handler(request)
        query = request.query.get("token")
        if query is not None and hmac.compare_digest(query.encode(), access.token.encode()):
            # Once: the cookie carries it from now on, and the address bar and history lose the token.
            rest = request.rel_url.with_query([(k, v) for k, v in request.query.items() if k != "token"])
            resp = web.Response(status=302, headers={"Location": str(rest)})
            resp.set_cookie(COOKIE, cookie, httponly=True, samesite="Strict", secure=access.ssl is not None,
                            path="/")
            return resp
        return _error(401, "this corral UI needs its token: open it once with ?token=TOKEN, or send "
                           "'Authorization: Bearer TOKEN'")

    return guard


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as a status and one line of JSON; never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except BadRequest as e:
        return _error(400, str(e))
    except NoHistory as e:
        return _error(503, str(e))
    except CliError as e:
        status = {USAGE: 400, NOT_FOUND: 404, UNREACHABLE: 503, TIMEOUT: 504}.get(e.code, 500)
        return _error(status, str(e))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:
        log.error("ui_request_failed", path=request.path, error=repr(e))
        return _error(500, f"internal error: {type(e).__name__} (the UI's log has it)")


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("X-Frame-Options", "DENY")


# --- query parameters --------------------------------------------------------------------------


def _params(request: web.Request, known: tuple[str, ...]) -> dict[str, str]:
    """The query as a dict; an unknown or repeated parameter is a 400 naming the known ones."""
    out: dict[str, str] = {}
    for key, value in request.query.items():
        if key == "token":
            continue
        if key not in known:
            raise BadRequest(f"unknown query parameter {key!r}; known: {', '.join(known) or 'none'}")
        if key in out:
            raise BadRequest(f"query parameter {key!r} given twice")
        out[key] = value
    return out


def _int(params: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise BadRequest(f"{name}={value} is out of range: {lo} to {hi}")
    return value


def _duration(params: dict[str, str], name: str, default: float) -> float:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = parse_duration(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r} is not a duration (like 30m, 24h, 7d)") from None
    if not 0 < value <= MAX_WINDOW_S:
        raise BadRequest(f"{name}={text!r} is out of range: more than 0, at most 400d")
    return value


def _job_id(request: web.Request) -> str:
    try:
        return check_id(request.match_info["job_id"], "job id")
    except InvalidId as e:
        raise BadRequest(str(e)) from None


def _states(params: dict[str, str]) -> frozenset[str]:
    out = frozenset(p.strip() for p in params.get("state", "").split(",") if p.strip())
    unknown = sorted(out - set(STATUSES))
    if unknown:
        raise BadRequest(f"unknown job state {unknown[0]!r}; known: {', '.join(STATUSES)}")
    return out


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
        app = web.Application(middlewares=[_errors, _guard(self.access)], client_max_size=4096)
        app.on_response_prepare.append(_security_headers)
        app.on_shutdown.append(self._close_streams)
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

    async def _close_streams(self, app: web.Application) -> None:
        for task in list(self._streams):
            task.cancel()

    async def index(self, request: web.Request) -> web.Response:
        _params(request, ())
        return web.Response(body=self.static["index.html"], content_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    async def static_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            return _error(404, f"no file {name!r}")
        return web.Response(body=self.static[name], content_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the full view, then a delta whenever the log changes (live.py)."""
        _params(request, ())
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
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.live.clients.discard(client)
            self._streams.discard(task)
        return resp

    async def overview(self, request: web.Request) -> web.Response:
        _params(request, ())
        return web.Response(body=self.live.overview(), content_type="application/json")

    async def jobs(self, request: web.Request) -> web.Response:
        """Jobs the live view holds, filtered; `history=1`: every job the index holds in the filters."""
        p = _params(request, ("state", "queue", "user", "limit", "history", "since"))
        states = _states(p)
        limit = _int(p, "limit", 500, 1, 5000)
        if p.get("history", "0") not in ("0", "1"):
            raise BadRequest(f"history={p['history']!r}: 0 or 1")
        for key in ("queue", "user"):
            if key in p and (not p[key] or len(p[key]) > 128):
                raise BadRequest(f"{key}= must be 1 to 128 characters")
        if p.get("history") == "1":
            return _json_response(await self._indexed_jobs(p, states, limit))
        state = self.live.state
        rows = [job_row(state, j) for j in state.jobs.values()
                if (not states or j.status in states) and (p.get("user") in (None, j.submitted_by))]
        if "queue" in p:
            rows = [r for r in rows if r["queue"] == p["queue"]]
        return _json_response({"seq": state.seq, "jobs": rows[-limit:]})

    async def _indexed_jobs(self, p: dict[str, str], states: frozenset[str], limit: int) -> dict[str, Any]:
        from orchestrator.cli.indexed import job_of
        from orchestrator.cli.webui.history import index_answer
        from orchestrator.index import api

        since = self.live.now() - _duration(p, "since", 7 * 86400.0)
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

        _params(request, ())
        job_id = _job_id(request)
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
        return _json_response(page)

    async def rank_log(self, request: web.Request) -> web.Response:
        """The tail of one rank's output, asked of its node's agent (`corral logs`)."""
        from orchestrator.cli.logs import ask
        from schemas.logs import LogRequest

        p = _params(request, ("rank", "bytes"))
        job_id = _job_id(request)
        rank = _int(p, "rank", 0, 0, 1_000_000)
        size = _int(p, "bytes", 8192, 1, LOG_TAIL_MAX)
        _, found = await self._find_job(job_id)
        node = next((rp.node_id for rp in found.placement if rp.rank == rank), None)
        if node is None:
            raise CliError(f"{job_id} has no rank {rank} placed on a node", NOT_FOUND)
        head = await ask(self.bus, node, LogRequest(job_id=job_id, attempt=found.attempt, rank=rank, limit=1))
        if head.error:
            return _json_response({"node": node, "rank": rank, "attempt": found.attempt, "error": head.error})
        start = max(0, head.size - size)
        chunk = await ask(self.bus, node, LogRequest(job_id=job_id, attempt=found.attempt, rank=rank,
                                                    restarts=head.restarts, offset=start, limit=size))
        return _json_response({"node": node, "rank": rank, "attempt": found.attempt, "path": chunk.path,
                               "from": start, "size": chunk.size, "running": chunk.running,
                               "text": chunk.data.decode(errors="replace"), "error": chunk.error or None})

    async def history(self, request: web.Request) -> web.Response:
        p = _params(request, ("window", "buckets"))
        window = _duration(p, "window", 86400.0)
        buckets = _int(p, "buckets", 24, 1, MAX_BUCKETS)
        until = self.live.now()
        capacity = sum(len(o) for o in self.live.state.owners.values())
        return _json_response(await history(self.bus, since=until - window, until=until, buckets=buckets,
                                            capacity=capacity))

    async def at(self, request: web.Request) -> web.Response:
        """The cluster at a past moment (`corral replay --at`)."""
        from orchestrator.cli.position import resolve_at
        from orchestrator.cli.state_view import load_state

        p = _params(request, ("at",))
        text = p.get("at", "").strip()
        if not text or len(text) > 64:
            raise BadRequest("at= is required: a position (#123), a duration before now (10m), or an ISO time")
        try:
            position = await resolve_at(self.bus, text)
        except ValueError as e:
            raise BadRequest(f"at={text!r}: {e}") from None
        state = await load_state(self.bus, to_seq=position.seq)
        return _json_response({"at": position.time, **cluster_payload(state, position.time),
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
    runner = web.AppRunner(UI(bus, live, access).app(), access_log=None, handle_signals=False)
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
        await runner.cleanup()
