"""Subjects of the log: which entity an event is about, so NATS filters server-side.

    corral.job.<job_id>.<Tag>     corral.node.<node_id>.<Tag>
    corral.queue.<queue>.<Tag>    corral.sched.<Tag>
    corral.job.<job_id>.<Tag>.<node_id>   (what an agent reports about a job's work on its node)

The reports of agents (NODE_REPORT_TAGS) carry their node as a fifth token,
so one node's slice of the log -- its own subjects, its reports, the
scheduler's -- is a server-side filter (`slice_filters`, issue #40), and a
node's credentials can be limited to its own reports (deploy/nats).

An id becomes one subject token, and NATS tokens cannot hold '.', '*', '>' or
whitespace: "a.b" would silently become two tokens and `corral.job.a.>` would
match another job's events. So every id corral puts in a subject must pass
`valid_id()`; `subject_for` refuses the rest instead of mangling them (two
different ids must never map to one subject). `id_from()` turns arbitrary text
such as a hostname into a valid id for callers that choose their own ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from schemas import EVENT_TAGS, Event, entity_of, tag_of

ROOT = "corral"
ALL = f"{ROOT}.>"

#: Requests for a worker's output go to `corral-logs.<node_id>`, answered by that node's agent
#: (request/reply, not the stream: logs are not events, so not under `corral.>`).
LOGS = "corral-logs"
#: A job's stdin for its rank 0 goes to `corral-stdin.<node_id>.<job_id>` (request/reply per chunk, answered
#: by the agent of rank 0's node; bytes, not events: never under `corral.>`). schemas/stdin.py.
STDIN = "corral-stdin"

#: Letters, digits, '_' and '-', starting with a letter or digit, at most 128
#: characters. Also valid as a KV key and a consumer-name fragment.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_NOT_ID_CHAR = re.compile(r"[^A-Za-z0-9_-]+")


class InvalidId(ValueError):
    """An id that cannot be one NATS subject token."""


def valid_id(value: object) -> bool:
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None


def check_id(value: str, what: str = "id") -> str:
    if not valid_id(value):
        raise InvalidId(
            f"{what} {value!r} is not a valid corral id: use 1-128 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def id_from(text: str) -> str:
    """A valid id from free text (e.g. a hostname): runs of other characters become '-'."""
    out = _NOT_ID_CHAR.sub("-", text).strip("-_")[:128]
    if not out:
        raise InvalidId(f"no id can be made from {text!r}")
    return out


#: What an agent reports about a job's work on its node: published as corral.job.<job>.<Tag>.<node>. A log
#: written before #40 holds them without the node token; readers match both (`tag_patterns`).
NODE_REPORT_TAGS = frozenset({"WorkerStarted", "WorkerExited", "Checkpointed", "DatasetStaging", "DatasetReady",
                              "DatasetFailed"})


def subject_for(event: Event) -> str:
    """The subject an event is published on; raises InvalidId for an id that would break it."""
    kind, ident = entity_of(event)
    tag = tag_of(event)
    if kind == "sched":
        return f"{ROOT}.sched.{tag}"
    base = f"{ROOT}.{kind}.{check_id(ident, kind + ' id')}.{tag}"
    node = getattr(event, "node_id", "") if tag in NODE_REPORT_TAGS else ""
    return f"{base}.{check_id(node, 'node id')}" if node else base


def tag_patterns(prefix: str, tag: str) -> list[str]:
    """The subjects of `tag` events under `prefix` ("corral.job.<id>", "corral.*.*"): a node report's both forms."""
    return [f"{prefix}.{tag}", f"{prefix}.{tag}.*"] if tag in NODE_REPORT_TAGS else [f"{prefix}.{tag}"]


def slice_filters(node_id: str) -> list[str]:
    """One node's slice of the log (issue #40), filtered by the server: the node's own subjects (its facts and
    the scheduler's orders to it), what it reported about jobs, and the scheduler's elections and settings."""
    node = check_id(node_id, "node id")
    return [f"{ROOT}.node.{node}.>", f"{ROOT}.job.*.*.{node}", f"{ROOT}.sched.>"]


def in_slice(subject: str, node_id: str) -> bool:
    """Whether `subject` is in `node_id`'s slice (what `slice_filters` selects)."""
    return matches(slice_filters(node_id), subject)


def log_subject(node_id: str) -> str:
    """Where `node_id`'s agent answers log requests (schemas.logs)."""
    return f"{LOGS}.{check_id(node_id, 'node id')}"


def stdin_subject(node_id: str, job_id: str) -> str:
    """Where a job's input for its rank 0 on `node_id` goes (schemas.stdin)."""
    return f"{STDIN}.{check_id(node_id, 'node id')}.{check_id(job_id, 'job id')}"


# --- filters -----------------------------------------------------------------


def job_filter(job_id: str) -> str:
    return f"{ROOT}.job.{check_id(job_id, 'job id')}.>"


def node_filter(node_id: str) -> str:
    return f"{ROOT}.node.{check_id(node_id, 'node id')}.>"


def queue_filter(queue: str) -> str:
    return f"{ROOT}.queue.{check_id(queue, 'queue')}.>"


def type_filters(*tags: str) -> list[str]:
    """Every event of these types, whatever entity it is about."""
    out: list[str] = []
    for tag in tags:
        _check_tag(tag)
        out += [*tag_patterns(f"{ROOT}.*.*", tag), f"{ROOT}.sched.{tag}"]
    return out


def filters(
    *,
    jobs: Iterable[str] = (),
    nodes: Iterable[str] = (),
    queues: Iterable[str] = (),
    types: Iterable[str] = (),
) -> list[str]:
    """Server-side filter subjects: events about any of the given entities, of any of `types`.

    Entities are OR'ed; `types` narrows them (AND). Nothing given: the whole log.
    The result never overlaps, which JetStream requires of `filter_subjects`.
    """
    tags = list(dict.fromkeys(types))
    for tag in tags:
        _check_tag(tag)
    entities = (
        [f"{ROOT}.job.{check_id(j, 'job id')}" for j in jobs]
        + [f"{ROOT}.node.{check_id(n, 'node id')}" for n in nodes]
        + [f"{ROOT}.queue.{check_id(q, 'queue')}" for q in queues]
    )
    if not entities:
        return type_filters(*tags) if tags else [ALL]
    if not tags:
        return normalize_filters(f"{e}.>" for e in entities)
    return normalize_filters(p for e in entities for t in tags for p in tag_patterns(e, t))


def _check_tag(tag: str) -> None:
    if tag not in EVENT_TAGS:
        raise ValueError(f"unknown event type {tag!r}; known: {', '.join(sorted(EVENT_TAGS))}")


def covers(pattern: str, subject: str) -> bool:
    """Whether every subject matched by `subject` (itself maybe a pattern) is matched by `pattern`."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s):
            return False
        if tok == "*":
            if s[i] == ">":
                return False
            continue
        if tok != s[i]:
            return False
    return len(p) == len(s)


def normalize_filters(subjects: Iterable[str] | None) -> list[str]:
    """Deduplicated filters with every one covered by another dropped (JetStream rejects overlaps)."""
    subs = list(dict.fromkeys(subjects or ()))
    keep = [s for s in subs if not any(covers(o, s) for o in subs if o != s)]
    return keep or [ALL]


def matches(filters_: Iterable[str], subject: str) -> bool:
    return any(covers(f, subject) for f in filters_)
