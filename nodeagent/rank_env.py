"""Each rank's environment: what torchrun would set, derived from the gang's placement.

Node order is the order of first appearance when ranks are sorted, so rank 0's
node is NODE_RANK 0 and MASTER_ADDR, and the scheduler's "ranks of one node are
contiguous" rule gives the usual LOCAL_RANK layout. Uneven layouts (3 ranks
on one node, 1 on another) still get consistent LOCAL_* values.

GPU ids: by default CUDA_VISIBLE_DEVICES holds NVML indices, with
CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs as NVML/nvidia-smi do (its
default "fastest first" order can differ). Pass `gpu_uuids` to use UUIDs
instead (immune to any renumbering; CUDA accepts `GPU-...` there too). A
runtime that exposes only the assigned GPUs (Docker device requests) renumbers
them from 0 inside the container: pass `isolated_gpus=True` there, and
NVIDIA_VISIBLE_DEVICES still names the host GPUs for the container toolkit.

MASTER_ADDR is rank 0's node address: right wherever ranks share the node's
network (processes, containers with host networking). A gang that lives in
one private network namespace instead (a one-rank job in a Docker bridge
network) finds rank 0 on its own loopback: `in_private_network`.

A worker on the host (process runtime) starts from `node_env`, never from the
agent's own environment: how the agent was launched (a venv binary not on PATH,
a service manager's bare PATH, a developer's PYTHONPATH) must not change what a
job finds. The job's `env` (the variables its submitter exported, and the
spec's own) goes over it, and corral's keys over both.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from schemas.events import RankPlacement
from schemas.jobspec import JobSpec

#: Set by corral; the job spec's env can never override these (nor any CORRAL_* key).
RANK_KEYS = frozenset(
    {
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
    }
)


#: MASTER_ADDR of a gang whose ranks share one private network namespace.
LOOPBACK = "127.0.0.1"


def in_private_network(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a rank whose whole gang is in one private network namespace: rank 0 is on loopback.

    The node's address would lead out of the namespace, to the node, where nothing listens on
    MASTER_PORT: rank 0 bound it inside.
    """
    return {**env, "MASTER_ADDR": LOOPBACK} if "MASTER_ADDR" in env else dict(env)


#: PATH after the interpreter's directory: the usual system directories, whatever the agent's PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What a worker takes from the agent's environment when set there: who it runs as and the locale.
ACCOUNT_KEYS = ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


def node_env(environ: Mapping[str, str] | None = None, python: str | None = None) -> dict[str, str]:
    """The environment every host worker starts from (the README's "What a worker gets").

    - PATH: the directory of the Python corral runs on, then SYSTEM_PATH: `python3`, `python` and
      `corral` are corral's own interpreter and its packages (the example worker imports them), even
      when the agent was started as `/some/venv/bin/corral` with that venv nowhere on PATH;
    - HOME, USER, LOGNAME, SHELL of the account the agent runs as (from the password database when
      the agent's environment lacks them), and LANG, LC_ALL, LC_CTYPE, TZ, TMPDIR when set;
    - PYTHONUNBUFFERED=1, so a Python worker's output reaches its log (and `corral run`) as it prints.
    """
    environ = os.environ if environ is None else environ
    python = sys.executable if python is None else python
    env = {k: environ[k] for k in ACCOUNT_KEYS if environ.get(k)}
    try:
        account = pwd.getpwuid(os.getuid())
    except KeyError:  # a uid with no passwd entry (some containers): what the environment says is all
        account = None
    if account is not None:
        env.setdefault("HOME", account.pw_dir)
        env.setdefault("USER", account.pw_name)
        env.setdefault("LOGNAME", account.pw_name)
        env.setdefault("SHELL", account.pw_shell or "/bin/sh")
    bindir = os.path.dirname(python) if python else ""
    env["PATH"] = f"{bindir}:{SYSTEM_PATH}" if bindir else SYSTEM_PATH
    env["PYTHONUNBUFFERED"] = "1"
    return env


def over_node_env(node: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """`env` (the job's, corral's keys included) over the node's baseline, with one merge: a job that brings
    its own PATH (its submitter's, exported by default) keeps it first, then the node's entries it lacks
    (corral's interpreter's directory, the system ones), so a command the submitter's PATH lacks is found
    where a job without exports finds it (`python` when the shell has only `python3`)."""
    merged = {**node, **env}
    theirs, ours = env.get("PATH"), node.get("PATH")
    if theirs is not None and ours:
        have = set(theirs.split(":"))
        extra = [d for d in ours.split(":") if d and d not in have]
        if extra:
            merged["PATH"] = ":".join([theirs, *extra]) if theirs else ":".join(extra)
    return merged


def is_reserved(key: str) -> bool:
    return key in RANK_KEYS or key.startswith("CORRAL_")


def ignored_spec_env(spec: JobSpec) -> tuple[str, ...]:
    """The spec env keys `rank_env` drops (corral sets them), so the agent can say so once."""
    return tuple(sorted(k for k in spec.env if is_reserved(k)))


def node_order(ranks: Sequence[RankPlacement]) -> tuple[str, ...]:
    """Node ids in NODE_RANK order: first appearance by ascending rank."""
    seen: dict[str, None] = {}
    for p in sorted(ranks, key=lambda p: p.rank):
        seen.setdefault(p.node_id, None)
    return tuple(seen)


def ranks_on_node(ranks: Sequence[RankPlacement], node_id: str) -> tuple[RankPlacement, ...]:
    """This node's placements, by ascending rank (LOCAL_RANK order)."""
    return tuple(sorted((p for p in ranks if p.node_id == node_id), key=lambda p: p.rank))


class GangPart(NamedTuple):
    """What one node needs of its gang for its ranks' environment (a WorkAssigned carries it, issue #40)."""

    #: This node's ranks, ascending (LOCAL_RANK order).
    local: tuple[RankPlacement, ...]
    world_size: int
    #: This node's index among the gang's nodes (`node_order`).
    node_rank: int
    #: Rank 0's node address.
    master_addr: str


def gang_part(ranks: Sequence[RankPlacement], node_id: str, node_addresses: Mapping[str, str],
              job_id: str = "") -> GangPart:
    """`node_id`'s part of the gang placed as `ranks`; ValueError for a placement no environment can come from."""
    by_rank = {p.rank: p for p in ranks}
    if 0 not in by_rank:
        raise ValueError(f"reservation of {job_id} has no rank 0")
    master_node = by_rank[0].node_id
    if master_node not in node_addresses:
        raise ValueError(f"no address for node {master_node!r} (rank 0 of {job_id})")
    order = node_order(ranks)
    return GangPart(ranks_on_node(ranks, node_id), len(ranks), order.index(node_id) if node_id in order else -1,
                    node_addresses[master_node])


def rank_env(
    ranks: Sequence[RankPlacement],
    rank: int,
    *,
    job_id: str,
    attempt: int,
    master_port: int,
    spec: JobSpec,
    node_addresses: Mapping[str, str],
    resume_from: str | None = None,
    checkpoint_dir: str | None = None,
    gpu_uuids: Mapping[int, str] | None = None,
    isolated_gpus: bool = False,
) -> dict[str, str]:
    """The full environment of `rank` of the gang placed as `ranks` (spec env first, corral's keys win).

    `ranks`, `attempt` and `master_port` are the gang's: a GangReserved's, or the folded Job's.
    `node_addresses` maps node id -> address other nodes reach it at (only rank
    0's node is needed). `checkpoint_dir` overrides the spec's (e.g. a per-job
    path on this host). CORRAL_RESUME_FROM is absent when there is nothing to
    resume from, so `os.environ.get` and `"X" in os.environ` agree.
    """
    me = next((p for p in ranks if p.rank == rank), None)
    if me is None:
        raise ValueError(f"rank {rank} is not in the reservation of {job_id}")
    return part_env(gang_part(ranks, me.node_id, node_addresses, job_id), rank, job_id=job_id, attempt=attempt,
                    master_port=master_port, spec=spec, resume_from=resume_from, checkpoint_dir=checkpoint_dir,
                    gpu_uuids=gpu_uuids, isolated_gpus=isolated_gpus)


def part_env(
    part: GangPart,
    rank: int,
    *,
    job_id: str,
    attempt: int,
    master_port: int,
    spec: JobSpec,
    resume_from: str | None = None,
    checkpoint_dir: str | None = None,
    gpu_uuids: Mapping[int, str] | None = None,
    isolated_gpus: bool = False,
) -> dict[str, str]:
    """`rank_env` from the node's part of the gang alone (what an agent of a node's slice knows)."""
    local = part.local
    me = next((p for p in local if p.rank == rank), None)
    if me is None:
        raise ValueError(f"rank {rank} is not on this node in the reservation of {job_id}")

    if isolated_gpus:
        cuda = ",".join(str(i) for i in range(len(me.gpus)))
    elif gpu_uuids is not None:
        cuda = ",".join(gpu_uuids[g] for g in me.gpus)
    else:
        cuda = ",".join(str(g) for g in me.gpus)
    host_ids = [gpu_uuids[g] for g in me.gpus] if gpu_uuids is not None else [str(g) for g in me.gpus]

    env = {k: v for k, v in spec.env.items() if not is_reserved(k)}
    env.update(
        {
            "WORLD_SIZE": str(part.world_size),
            "RANK": str(rank),
            "LOCAL_RANK": str(local.index(me)),
            "LOCAL_WORLD_SIZE": str(len(local)),
            "NODE_RANK": str(part.node_rank),
            "MASTER_ADDR": part.master_addr,
            "MASTER_PORT": str(master_port),
            "CUDA_VISIBLE_DEVICES": cuda,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            # "void": no GPU for a CPU-only rank (the container toolkit's value for none).
            "NVIDIA_VISIBLE_DEVICES": ",".join(host_ids) if host_ids else "void",
            "CORRAL_JOB_ID": job_id,
            "CORRAL_ATTEMPT": str(attempt),
            "CORRAL_NODE_ID": me.node_id,
            "CORRAL_CHECKPOINT_SIGNAL": spec.checkpoint_signal,
        }
    )
    ckpt = checkpoint_dir if checkpoint_dir is not None else spec.checkpoint_dir
    if ckpt:
        env["CORRAL_CHECKPOINT_DIR"] = ckpt
    if resume_from:
        env["CORRAL_RESUME_FROM"] = resume_from
    array = spec.gating.array
    if array is not None:  # an element of a job array (`corral submit --array`), as Slurm's SLURM_ARRAY_*
        env["CORRAL_ARRAY_INDEX"] = str(array.index)
        env["CORRAL_ARRAY_JOB_ID"] = array.array_id
    return env
