"""Who may do what on corral's NATS: one table, rendered into every server config.

Roles (one NATS account, ``CORRAL``, holds the stream, the KV buckets and the
object store; every corral user lives in it):

- ``client``    submits and cancels jobs.
- ``admin``     a client that also defines queues and cordons nodes (the
                operator's CLI): queue weights and limits are not a team's own
                business.
- ``agent``     one user per node, ``agent-<node>``: registers its own node and
                reports its own node's facts (``corral.node.<node>.<Tag>``), and
                the workers, checkpoints and datasets of any job on its own node
                (``corral.job.<job>.<Tag>.<node>``: a gang's ranks live on several
                nodes, so the report's subject names the node, issue #40),
                writes its own heartbeat key only, and answers ``corral logs``
                requests for its own node (``corral-logs.<node>``), which
                ``client`` and ``admin`` may send, and the input of interactive
                jobs' rank 0 on its node (``corral-stdin.<node>.<job>``, from
                ``corral run``; each request carries the job's key, which only
                the submitting ``corral run`` holds: nodeagent/stdin.py).
- ``scheduler`` writes every decision, creates the stream and buckets, holds
                the leader lease and the snapshots. Active and standby
                schedulers use the same user: the lease and the epoch in the
                log, not NATS, decide who leads.
- ``ops``       reads everything (tail, replay, heartbeats), writes nothing.
- ``archiver``  the archiver (orchestrator/archiver.py, ``corral archive``):
                reads everything, and purges the CORRAL stream (retention, up
                to what its archive holds); it appends nothing and touches no
                other stream or bucket.
- ``admission`` the admission service (orchestrator/scheduler/gateway.py): answers
                the requests team accounts send on ``corral-submit.*`` and
                ``corral-cancel.*``, appends JobSubmitted and CancelRequested
                for the teams that own the queue.
- ``index``     the accounting and forensics index (`corral index`,
                orchestrator/index/): reads the log, answers the
                ``corral-index.*`` requests that ``client``, ``admin`` and
                ``ops`` send (usage, jobs, a job's story), writes nothing.

Team users (``client-<team>``) are not in ``CORRAL``: each team is its own
account (``TEAM_<TEAM>``) that imports the admission requests and the read
side of JetStream from ``CORRAL``. A team user may publish nothing on
``corral.>``; its ``corral-submit.<job>`` requests reach the admission service
with the server's ``Nats-Request-Info`` stamp saying which account sent them.

What a role may append is a subject that names one type and one entity
(AUTHORS, events/authorship.py), and every reader folds an event only where
its subject is the one its type and entity give (`events.authorship.judged`):
a client's GpuUnhealthy on its own ``corral.job.<id>.JobSubmitted``, or an
agent's report about another node on its own subject, is refused by every
fold (issue #39).

Everyone reads: the log, the heartbeats, the lease and the snapshots are facts
every service folds. What is guarded is *writing*, so a publish permission is
the boundary, and so is the JetStream API, whose every write (create, update,
delete, purge a stream; delete a message) is a request on a ``$JS.API.`` subject.

Why ``allow_responses`` only for the admission service, the index and agents, which
answer requests on their own subjects (and may subscribe to nothing else):
JetStream acks (``$JS.ACK.>``) and flow-control replies (``$JS.FC.>``) are
granted by name instead, because ``allow_responses`` would also let anyone who sees a publish
on ``corral.>`` answer it, i.e. forge the PubAck of the scheduler's own append
or lease update.
"""

from __future__ import annotations

import re
from typing import Any

from events.authorship import AUTHORS
from events.subjects import NODE_REPORT_TAGS

STREAM = "CORRAL"
HEARTBEATS = "corral-heartbeats"
LEADER = "corral-leader"
SNAPSHOTS = "corral-snapshots"
#: Each node's view as of a position (events/nodeviews.py): the scheduler writes, everyone reads.
NODEVIEWS = "corral-nodeviews"

ROLES = ("client", "admin", "agent", "scheduler", "ops", "admission", "index", "team", "archiver")

#: The admission service's request subjects (events.sdk.ADMISSION_SUBMIT/CANCEL + ".*").
ADMISSION_REQUESTS = ("corral-submit.*", "corral-cancel.*")

#: `corral logs` requests (events.subjects.log_subject): `corral-logs.<node>`, answered by that node's agent.
LOG_REQUESTS = "corral-logs.*"
#: Roles that may read workers' output (a job's logs may hold what its spec does not: keep it to users).
LOG_READERS = ("client", "admin")
#: `corral run`'s input for rank 0 (events.subjects.stdin_subject): `corral-stdin.<node>.<job>`, answered by that
#: node's agent, which writes only what carries the job's key (JobSpec.interactive): a subscriber could read the
#: key, so only the node's own agent may subscribe.
STDIN_REQUESTS = "corral-stdin.*.*"

#: The index's request subjects (orchestrator.index.api): outside `corral.>`, so never stored in the log.
INDEX_REQUESTS = "corral-index.*"
#: Roles that may ask the index: it answers from the log, which they may read anyway (ops too: a request
#: is a publish, so ops gets exactly these subjects and still writes nothing to the log).
INDEX_ASKERS = ("client", "admin", "ops")

#: Which role appends which event tag: one table, shared with the readers' check (events/authorship.py).
#: The scheduler may publish any tag (new decisions need no config change); the others only theirs.
#: A test checks that every tag in schemas has an owner.
APPENDS = AUTHORS

#: What the admission service appends for the teams: submits and cancels (no holds: a team has no `hold`).
ADMISSION_APPENDS = ("corral.job.*.JobSubmitted", "corral.job.*.CancelRequested")

#: Mirrors events.subjects.ID_RE: a node id must be one subject token and one KV key.
NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")

# Reading: JetStream's read-only API, consumers, acks and flow control. Consumer
# deletion is allowed because clients clean up their own ephemeral consumers;
# consumer names carry no owner, so one reader can delete another's (an outage
# of that reader until it recreates it, never a change to the log).
READ_API = (
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.MSG.GET.*",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.DURABLE.CREATE.>",
    "$JS.API.CONSUMER.INFO.>",
    "$JS.API.CONSUMER.NAMES.*",
    "$JS.API.CONSUMER.LIST.*",
    "$JS.API.CONSUMER.MSG.NEXT.>",
    "$JS.API.CONSUMER.DELETE.>",
    "$JS.ACK.>",
    "$JS.FC.>",
)
#: Read API requests answered by a stream of messages, not one (exported with response_type stream).
STREAMED_READ_API = ("$JS.API.CONSUMER.MSG.NEXT.>",)


def inbox_prefix(user: str) -> str:
    """The only subjects `user` may subscribe to: `<prefix>.>` (nats.connect(inbox_prefix=...)).

    Why every user gets its own inbox and no one may subscribe to `corral.>`:
    anyone who may create a consumer may also set its deliver subject, and
    JetStream delivers there as soon as some connection subscribes to that
    literal subject. A push consumer on the heartbeat bucket delivering to
    `corral.job.x.GangReserved`, plus a subscription to it, makes the CORRAL
    stream store the agent's heartbeats (payload of its choosing, subject
    still `$KV...`): a write no publish permission allowed (tests/deploy
    shows it). With subscriptions limited to a private inbox nobody can make
    that interest, and nobody can learn another user's inbox names to deliver
    forged messages into its consumers. Read the log through JetStream
    (`corral tail`, `nats sub --stream CORRAL`), never a core subscription.
    """
    return f"_INBOX_{user}"


def _append(role: str, entity: str) -> list[str]:
    return [f"corral.{entity}.*.{tag}" for tag in APPENDS[role]]


def role_permissions(role: str, user: str, node: str | None = None) -> dict[str, Any]:
    """The `permissions` block of `user`, who has `role` (`node` for agents)."""
    if (role == "agent") != (node is not None):
        raise ValueError("an agent user needs its node id, and only an agent has one")
    if role == "agent":
        assert node is not None
        check_node_id(node)
        # Its own node's facts, and its reports about jobs on its node (events.subjects.NODE_REPORT_TAGS:
        # corral.job.<job>.<Tag>.<node>), by name: never `corral.node.<node>.>`, which would let it write
        # the scheduler's orders to its node (WorkAssigned) or its own NodeFailed.
        writes = [
            *(f"corral.node.{node}.{tag}" for tag in APPENDS["agent"] if tag not in NODE_REPORT_TAGS),
            *(f"corral.job.*.{tag}.{node}" for tag in APPENDS["agent"] if tag in NODE_REPORT_TAGS),
            f"$KV.{HEARTBEATS}.{node}",
        ]
        # It answers `corral logs` for its own node only: allow_responses lets it reply to what it
        # received (those requests, its inbox), not publish on anyone's inbox.
        return {
            "publish": {"allow": _without_covered([*writes, *READ_API])},
            "subscribe": {"allow": [f"{inbox_prefix(user)}.>", f"{LOG_REQUESTS.removesuffix('*')}{node}",
                                    f"{STDIN_REQUESTS.removesuffix('*.*')}{node}.*"]},
            "allow_responses": True,
        }
    elif role == "client":
        writes = [*_append("client", "job"), LOG_REQUESTS, STDIN_REQUESTS, INDEX_REQUESTS]
    elif role == "admin":
        writes = [
            *_append("client", "job"),
            LOG_REQUESTS,
            STDIN_REQUESTS,
            INDEX_REQUESTS,
            "corral.queue.*.QueueDefined",
            "corral.queue.*.QueueDeleted",
            "corral.node.*.NodeCordoned",
            "corral.node.*.NodeUncordoned",
            "corral.node.*.GpuUnhealthy",  # corral gpu drain / undrain
            "corral.node.*.GpuHealthy",
            "corral.job.*.JobUpdateByOperator",  # corral update --operator (issue #41)
            "corral.sched.ReservationCreated",  # corral reservation create / delete
            "corral.sched.ReservationDeleted",
            "corral.node.*.DatasetEvictRequested",  # corral datasets evict
        ]
    elif role == "scheduler":
        writes = [
            "corral.>",
            "$JS.API.>",
            f"$KV.{HEARTBEATS}.>",  # removes the key of a node taken out of service
            f"$KV.{LEADER}.>",
            f"$O.{SNAPSHOTS}.>",
            f"$KV.{NODEVIEWS}.>",
        ]
    elif role == "ops":
        writes = [INDEX_REQUESTS]
    elif role == "archiver":
        writes = [f"$JS.API.STREAM.PURGE.{STREAM}"]
    elif role == "index":
        # It reads the log (direct gets included) and answers its requests: allow_responses lets it reply to
        # what it received (those requests, its inbox) and publish nothing else, least of all on `corral.>`.
        return {
            "publish": {"allow": _without_covered(list(READ_API))},
            "subscribe": {"allow": [INDEX_REQUESTS, f"{inbox_prefix(user)}.>"]},
            "allow_responses": True,
        }
    elif role == "admission":
        # It appends for the teams; answering their requests needs allow_responses, which here
        # lets it answer only what it received: corral-submit/cancel requests and its own inbox.
        return {
            "publish": {"allow": _without_covered([*ADMISSION_APPENDS, *READ_API])},
            "subscribe": {"allow": [*ADMISSION_REQUESTS, f"{inbox_prefix(user)}.>"]},
            "allow_responses": True,
        }
    elif role == "team":
        # In its team's own account: requests to admission and the imported read API, nothing else.
        writes = list(ADMISSION_REQUESTS)
    else:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    publish = _without_covered([*writes, *READ_API])
    # Replies (PubAcks, API answers) and consumer deliveries: this user's inbox only.
    return {"publish": {"allow": publish}, "subscribe": {"allow": [f"{inbox_prefix(user)}.>"]}}


def covers(pattern: str, subject: str) -> bool:
    """Whether every subject that `subject` (maybe itself a wildcard) matches, `pattern` matches too."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok == "*" and s[i] == ">") or tok not in ("*", s[i]):
            return False
    return len(p) == len(s)


def _without_covered(subjects: list[str]) -> list[str]:
    subs = list(dict.fromkeys(subjects))
    return [s for s in subs if not any(o != s and covers(o, s) for o in subs)]


def check_node_id(node: str) -> str:
    if not NODE_ID_RE.fullmatch(node):
        raise ValueError(
            f"node id {node!r} cannot be a subject token: use letters, digits, '_' or '-' "
            "(corral maps a hostname such as 'gpu1.example.com' to 'gpu1-example-com')"
        )
    return node
