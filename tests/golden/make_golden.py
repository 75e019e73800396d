"""Writes tests/golden/v1_events.jsonl: one encoded event per line, as this code version writes them.

The golden log is a record of what past code put on the wire, so this script
never rewrites a line that exists: run it after adding an event type and it
appends lines for the types the file lacks (test_golden tells you which).
A line's bytes are frozen once committed; a test decodes them with the
current code.

    .venv/bin/python tests/golden/make_golden.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schemas import (
    CancelRequested,
    Checkpointed,
    ClusterConfigured,
    DatasetEvicted,
    DatasetEvictRequested,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    Event,
    FieldChange,
    GangReserved,
    GangRestarted,
    Gpu,
    GpuHealthy,
    GpuUnhealthy,
    Inventory,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobRejected,
    JobReleased,
    JobRequeued,
    JobRunning,
    JobSpec,
    JobSubmitted,
    JobUpdateByOperator,
    JobUpdated,
    JobUpdateRequested,
    JobWaiting,
    Mount,
    NodeCordoned,
    NodeDatasets,
    NodeFailed,
    NodeHealthChecked,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    Preempted,
    PreemptionRequested,
    QueueDefined,
    QueueDeleted,
    RequeueRequested,
    ReservationCreated,
    ReservationDeleted,
    SchedulerElected,
    Topology,
    WorkAssigned,
    WorkChanged,
    WorkerExited,
    WorkerStarted,
    encode,
    tag_of,
)
from schemas.events import CachedDataset, RankPlacement

GOLDEN = Path(__file__).with_name("v1_events.jsonl")
T = 1_764_460_800.0  # 2025-11-30T00:00:00Z


def _h100_node(n: int) -> Inventory:
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-{n:02d}{i:02d}a1b2-c3d4-e5f6-0718-29304a5b6c7d", model="NVIDIA H100 80GB HBM3",
            memory_mib=81559, pci_bus_id=f"00000000:{(0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)[i]:02X}:00.0",
            nvlink_peers=tuple(f"GPU-{n:02d}{j:02d}a1b2-c3d4-e5f6-0718-29304a5b6c7d" for j in range(8) if j != i))
        for i in range(8)
    )
    links = tuple(tuple(0 if i == j else 118 for j in range(8)) for i in range(8))  # NV18 everywhere
    return Inventory(gpus=gpus, links=links, labels={"block": "b1", "leaf": f"leaf-{n // 4}"},
                     fabric_cluster_uuid=None, fabric_clique_id=None)


SPEC = JobSpec(
    name="llama3-8b-finetune", queue="research", priority=10, ranks=2, gpus_per_rank=8,
    gpu_model="NVIDIA H100 80GB HBM3", min_gpu_memory_mib=80000, topology=Topology(level="leaf", mode="require"),
    image="nvcr.io/nvidia/pytorch:24.05-py3", command=("torchrun", "--nnodes=2", "train.py", "--config", "ft.yaml"),
    env={"NCCL_DEBUG": "WARN", "WANDB_PROJECT": "llama-ft"},
    mounts=(Mount(source="/datasets/pile", target="/data", read_only=True),),
    checkpoint_dir="/checkpoints/j-3f9a1c2b7d", checkpoint_signal="SIGUSR1", grace_period_s=120.0,
    restart_policy="gang", max_restarts=3, time_limit_s=172800.0, preemptible=True,
)
J = "j-3f9a1c2b7d"
PILE_KEY = "sha256-2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
PLACEMENT = (RankPlacement(rank=0, node_id="dgx-h100-07", gpus=(0, 1, 2, 3, 4, 5, 6, 7)),
             RankPlacement(rank=1, node_id="dgx-h100-08", gpus=(0, 1, 2, 3, 4, 5, 6, 7)))


def samples() -> list[Event]:
    """At least one realistic event of every type, in an order a real log could have."""
    return [
        SchedulerElected(event_id="elected:1", occurred_at=T, epoch=1, scheduler_id="sched-7c1e"),
        ClusterConfigured(event_id="configured:1", occurred_at=T + 0.1, topology_levels=("block", "leaf"),
                          fairshare_half_life_s=604800.0, min_runtime_s=300.0, default_queue="default"),
        QueueDefined(event_id="queue:research:5d2e8a1f0b3c4d6e", occurred_at=T + 1, queue="research", weight=2.0,
                     guaranteed_gpus=32, limit_gpus=128, parent="org"),
        NodeRegistered(event_id="registered:dgx-h100-07:1f2e", occurred_at=T + 2, node_id="dgx-h100-07",
                       incarnation="1f2e", address="10.12.0.7:7070", inventory=_h100_node(7)),
        JobSubmitted(event_id=f"submit:{J}", occurred_at=T + 10, job_id=J, spec=SPEC, submitted_by="alice"),
        JobWaiting(event_id=f"waiting:{J}:0:4", occurred_at=T + 10.5, job_id=J, code="insufficient_gpus",
                   message="needs 16 GPUs in one leaf; the largest free leaf has 8", epoch=1),
        GangReserved(event_id=f"reserve:{J}:1:5", occurred_at=T + 11, job_id=J, attempt=1, epoch=1,
                     ranks=PLACEMENT, master_port=29500, reason="fits leaf-1"),
        WorkerStarted(event_id=f"started:{J}:1:0", occurred_at=T + 13, job_id=J, attempt=1, rank=0,
                      node_id="dgx-h100-07", worker_id="ctr-8d2f1a", restarts=0),
        JobRunning(event_id=f"running:{J}:1:8", occurred_at=T + 14, job_id=J, attempt=1),
        Checkpointed(event_id=f"ckpt:{J}:1:0:1500", occurred_at=T + 900, job_id=J, attempt=1, rank=0, step=1500,
                     path=f"/checkpoints/{J}/step-1500"),
        PreemptionRequested(event_id=f"preempt:{J}:1:12", occurred_at=T + 1000, job_id=J, attempt=1,
                            preemptor_job_id="j-00ab77e1c4", reason="priority 100 > 10", grace_s=120.0, epoch=1,
                            earmark=PLACEMENT),
        WorkerExited(event_id=f"exited:{J}:1:0", occurred_at=T + 1050, job_id=J, attempt=1, rank=0,
                     node_id="dgx-h100-07", exit_code=None, signal=10, reason="preempted",
                     log_tail="saving checkpoint step-1520 ... done", restarts=0, will_restart=False),
        Preempted(event_id=f"preempted:{J}:1", occurred_at=T + 1051, job_id=J, attempt=1,
                  preemptor_job_id="j-00ab77e1c4", resume_from=f"/checkpoints/{J}/step-1520"),
        GangRestarted(event_id=f"restart:{J}:2:20", occurred_at=T + 2000, job_id=J, attempt=2,
                      reason="rank 1 crashed (exit 139), restarts left 2", epoch=1),
        NodeFailed(event_id="failed:dgx-h100-08:1f2e", occurred_at=T + 3000, node_id="dgx-h100-08",
                   incarnation="1f2e", reason="no heartbeat for 30s"),
        JobRequeued(event_id=f"requeue:{J}:3:25", occurred_at=T + 3001, job_id=J, attempt=3,
                    reason="node dgx-h100-08 failed", resume_from=f"/checkpoints/{J}/step-2210", epoch=1),
        NodeRecovered(event_id="recovered:dgx-h100-08:2a9c", occurred_at=T + 3600, node_id="dgx-h100-08",
                      incarnation="2a9c"),
        NodeCordoned(event_id="cordon:dgx-h100-08:7f3a", occurred_at=T + 3700, node_id="dgx-h100-08",
                     reason="ECC errors on GPU 3"),
        NodeUncordoned(event_id="uncordon:dgx-h100-08:9b1d", occurred_at=T + 7200, node_id="dgx-h100-08"),
        JobCompleted(event_id=f"completed:{J}:3:40", occurred_at=T + 9000, job_id=J, attempt=3),
        JobRejected(event_id="reject:j-5c6d7e8f90:0:41", occurred_at=T + 9001, job_id="j-5c6d7e8f90",
                    reasons=("ranks.gpus_per_rank: 16 GPUs per rank, but no node has more than 8",
                             "queue 'nope' is not defined")),
        JobFailed(event_id="failed:j-77aa88bb99:4:50", occurred_at=T + 9500, job_id="j-77aa88bb99", attempt=4,
                  reason="rank 0 exited 1 and max_restarts (3) is used up"),
        CancelRequested(event_id="cancel:j-00ab77e1c4", occurred_at=T + 9600, job_id="j-00ab77e1c4",
                        reason="superseded by a new sweep", requested_by="bob"),
        JobCancelled(event_id="cancelled:j-00ab77e1c4:1:61", occurred_at=T + 9601, job_id="j-00ab77e1c4",
                     reason="superseded by a new sweep"),
        QueueDeleted(event_id="queue-deleted:sandbox:4e1f", occurred_at=T + 9700, queue="sandbox",
                     reason="not in queues.yaml (queue apply --prune)"),
        JobHeld(event_id="hold:j-5ee1d0a1b2:7c1f", occurred_at=T + 9800, job_id="j-5ee1d0a1b2", requested_by="alice",
                reason="waiting for the new dataset"),
        JobReleased(event_id="release:j-5ee1d0a1b2:9e2d", occurred_at=T + 9900, job_id="j-5ee1d0a1b2",
                    requested_by="alice"),
        GpuUnhealthy(event_id="gpu-unhealthy:dgx-h100-07:3:xid79:1f2e:1", occurred_at=T + 9800, node_id="dgx-h100-07",
                     gpu_index=3, gpu_uuid="GPU-3d2f1a9c-0b7e-4c1d-9a53-2f4c6b0c9d13",
                     reason="Xid 79 (GPU has fallen off the bus)", xid=79, severity="fatal", running_job=J),
        GpuHealthy(event_id="gpu-healthy:dgx-h100-07:3:ops:1", occurred_at=T + 9900, node_id="dgx-h100-07",
                   gpu_index=3, gpu_uuid="GPU-3d2f1a9c-0b7e-4c1d-9a53-2f4c6b0c9d13",
                   reason="undrained by alice: GPU replaced", source="operator"),
        NodeHealthChecked(event_id="health-check:dgx-h100-07:1f2e:1", occurred_at=T + 9950, node_id="dgx-h100-07",
                          ok=False, exit_code=1, output="ERROR: ib0 link down"),
        NodeDatasets(event_id="node-datasets:dgx-h100-07:2b3c", occurred_at=T + 9960, node_id="dgx-h100-07",
                     datasets=(CachedDataset(key=PILE_KEY, size_bytes=52_428_800, last_used=T + 9000),),
                     capacity_bytes=500_000_000_000),
        DatasetStaging(event_id=f"staging:{J}:3:dgx-h100-08:pile:1", occurred_at=T + 9970, job_id=J, attempt=3,
                       node_id="dgx-h100-08", dataset="pile", key=PILE_KEY, bytes_done=20_971_520,
                       bytes_total=52_428_800),
        DatasetReady(event_id=f"ready:{J}:3:dgx-h100-08:pile", occurred_at=T + 9975, job_id=J, attempt=3,
                     node_id="dgx-h100-08", dataset="pile", key=PILE_KEY, size_bytes=52_428_800, cached=False,
                     staged_bytes=52_428_800),
        DatasetFailed(event_id=f"dataset-failed:{J}:3:dgx-h100-07:tok", occurred_at=T + 9976, job_id=J, attempt=3,
                      node_id="dgx-h100-07", dataset="tok", key="src-0b1c2d3e4f5061728394a5b6c7d8e9f0",
                      reason="digest mismatch: sha256 of https://data.example/tok.tar is 9f86d0...; spec says e3b0c4..."),
        DatasetEvicted(event_id=f"evicted:dgx-h100-07:{PILE_KEY}:1", occurred_at=T + 9990, node_id="dgx-h100-07",
                       key=PILE_KEY, size_bytes=52_428_800, reason="least recently used; cache over 500 GB"),
        DatasetEvictRequested(event_id=f"dataset-evict:dgx-h100-07:{PILE_KEY}:5e6f", occurred_at=T + 9996,
                              node_id="dgx-h100-07", key=PILE_KEY, requested_by="alice",
                              reason="the pile was rebuilt"),
        WorkAssigned(event_id=f"assign:dgx-h100-08:{J}:3", occurred_at=T + 9991, node_id="dgx-h100-08", job_id=J,
                     attempt=3, epoch=1, spec=SPEC, ranks=PLACEMENT[1:], world_size=2, node_rank=1,
                     master_addr="10.12.0.7", master_port=29500, resume_from=f"/checkpoints/{J}/step-2210",
                     not_before=0.0, staged=False),
        WorkChanged(event_id=f"work:dgx-h100-08:{J}:3:checkpoint", occurred_at=T + 9995, node_id="dgx-h100-08",
                    job_id=J, attempt=3, epoch=1, intent="checkpoint", staged=True, grace_s=120.0,
                    reason="preempted by j-00ab77e1c4"),
        JobUpdateRequested(event_id="update:j-5ee1d0a1b2:4a5b", occurred_at=T + 10_000, job_id="j-5ee1d0a1b2",
                           requested_by="alice", priority=50, time_limit_s=7200.0),
        JobUpdateByOperator(event_id="update:j-77aa88bb99:6c7d", occurred_at=T + 10_001, job_id="j-77aa88bb99",
                            requested_by="ops", time_limit_s=86_400.0, reason="deadline extension"),
        JobUpdated(event_id="updated:update:j-5ee1d0a1b2:4a5b:70", occurred_at=T + 10_002, job_id="j-5ee1d0a1b2",
                   request_id="update:j-5ee1d0a1b2:4a5b", epoch=1, requested_by="alice",
                   changes=(FieldChange(field="priority", old=0, new=50),
                            FieldChange(field="time_limit_s", old=None, new=7200.0))),
        RequeueRequested(event_id="requeue:j-77aa88bb99:8e9f", occurred_at=T + 10_003, job_id="j-77aa88bb99",
                         requested_by="bob", reason="bad node, try again"),
        ReservationCreated(event_id="reservation:maint:1a2b", occurred_at=T + 10_004, name="maint",
                           nodes=("dgx-h100-07", "dgx-h100-08"), start=T + 20_000, end=T + 27_200,
                           users=("ops",), created_by="ops", reason="firmware upgrade"),
        ReservationDeleted(event_id="reservation-deleted:maint:3c4d", occurred_at=T + 10_005, name="maint",
                           deleted_by="ops"),
    ]


#: Lines no current code writes, that every reader must survive; written only with a new file.
SPECIAL_LINES = [
    # A tag from the future (or another producer): Unknown, not a crash.
    json.dumps({"type": "JobTeleported", "event_id": "teleport:j-1", "occurred_at": T, "job_id": "j-1",
                "to": "mars"}, separators=(",", ":")),
    # Corrupted: cut off mid-payload.
    '{"type":"JobRunning","event_id":"running:j-2:1","occurred_at":1764460800.0,"job_id":"j-',
    # Valid JSON of a known tag with a field of the wrong type.
    json.dumps({"type": "JobRunning", "event_id": "running:j-3:1", "occurred_at": "yesterday",
                "job_id": "j-3", "attempt": 1}, separators=(",", ":")),
    # The pre-release JobSubmitted.v0 (GPU count named `gpus`, no ranks): upcast to JobSubmitted.
    json.dumps({"type": "JobSubmitted.v0", "event_id": "submit:j-0ld5ub0000", "occurred_at": T - 86400,
                "job_id": "j-0ld5ub0000", "spec": {"name": "resnet50", "gpus": 4, "image": "pytorch:23.10"},
                "submitted_by": "carol"}, separators=(",", ":")),
]


def existing_tags(path: Path) -> set[str]:
    tags: set[str] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                tags.add(json.loads(line).get("type"))
            except ValueError:
                pass
    return tags


def main() -> None:
    have = existing_tags(GOLDEN)
    new = [ev for ev in samples() if tag_of(ev) not in have]
    lines = [encode(ev).decode() for ev in new]
    if not GOLDEN.exists():
        lines += SPECIAL_LINES
    with GOLDEN.open("a") as f:
        for line in lines:
            f.write(line + "\n")
    print(f"{GOLDEN}: appended {len(lines)} lines ({', '.join(tag_of(e) for e in new) or 'no new types'})")


if __name__ == "__main__":
    main()
