"""A toy training worker for corral: counts steps, checkpoints on a signal, resumes.

It ships with corral (`python -m orchestrator.demo_worker`), so `corral up --demo` runs
from any directory; examples/worker.py, which the example jobs run, is this module.
Pure standard library and no corral import, so it runs in any image with a Python
(deploy/Dockerfile's `worker` target copies this one file). What it shows:
- read the rank environment corral sets (RANK, WORLD_SIZE, LOCAL_RANK, ...);
- resume from CORRAL_RESUME_FROM (a state file, or a manifest naming one);
- on the checkpoint signal (CORRAL_CHECKPOINT_SIGNAL, default SIGUSR1), save
  at the next step boundary: the state file first, then the manifest
  {"step", "path", "rank", "attempt"} in CORRAL_CHECKPOINT_DIR, each via tmp
  + rename, so the agent never reads a manifest that points at half a file
  (the attempt, CORRAL_ATTEMPT, lets it tell this attempt's checkpoints from
  those of an orphaned earlier one);
- then exit 0 (preemption) or keep going (--on-checkpoint continue);
- a signalled checkpoint that cannot be saved (a full disk) exits 1 after a
  `CORRAL_STEP=N` line: the agent records the failure and the steps lost.

The "model" is a running sum of step numbers: after any number of
checkpoint/resume cycles it must equal sum(range(steps)), which tests check.

    python -m orchestrator.demo_worker --steps 500 --step-ms 2 [--checkpoint-every 100]
    env: WORKER_STEPS, WORKER_STEP_MS, WORKER_ON_CHECKPOINT, WORKER_FAIL_AT_STEP
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
             "CUDA_VISIBLE_DEVICES", "CORRAL_JOB_ID", "CORRAL_ATTEMPT")  # fmt: skip


def log(msg: str) -> None:
    print(msg, flush=True)


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per writer: an orphaned attempt may write too
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_state(resume_from: str) -> dict[str, Any]:
    """A state file, or a manifest whose "path" names one."""
    data: dict[str, Any] = json.loads(Path(resume_from).read_text())
    if "path" in data and "value" not in data:
        data = json.loads(Path(data["path"]).read_text())
    return data


def attempt_of(env: Mapping[str, str]) -> int:
    """CORRAL_ATTEMPT, or 0 (unknown) when it is missing or not a number."""
    try:
        return int(env.get("CORRAL_ATTEMPT", "0"))
    except ValueError:
        return 0


def checkpoint(ckpt_dir: str | None, rank: int, step: int, value: int, attempt: int = 0) -> Path | None:
    if not ckpt_dir:
        log("no CORRAL_CHECKPOINT_DIR: cannot checkpoint")
        return None
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    state = d / f"rank{rank}-step{step:08d}.state.json"
    write_atomic(state, {"step": step, "value": value, "rank": rank})
    write_atomic(d / f"manifest-rank{rank}.json", {"step": step, "path": str(state), "rank": rank, "attempt": attempt})
    log(f"checkpoint step {step} -> {state}")
    return state


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=int(env.get("WORKER_STEPS", "200")))
    p.add_argument("--step-ms", type=float, default=float(env.get("WORKER_STEP_MS", "5")))
    p.add_argument("--checkpoint-every", type=int, default=int(env.get("WORKER_CHECKPOINT_EVERY", "0")))
    p.add_argument("--on-checkpoint", choices=("exit", "continue"), default=env.get("WORKER_ON_CHECKPOINT", "exit"),
                   help="what to do after a signalled checkpoint")  # fmt: skip
    p.add_argument("--fail-at-step", type=int, default=int(env.get("WORKER_FAIL_AT_STEP", "-1")))
    args = p.parse_args(argv)

    rank = int(env.get("RANK", "0"))
    ckpt_dir = env.get("CORRAL_CHECKPOINT_DIR")
    log("rank env: " + " ".join(f"{k}={env.get(k, '')}" for k in RANK_VARS))

    requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal requested
        requested = True  # acted on at the next step boundary, never mid-step

    sig_name = env.get("CORRAL_CHECKPOINT_SIGNAL", "SIGUSR1")
    signal.signal(getattr(signal, sig_name), on_signal)

    step, value = 0, 0
    resume_from = env.get("CORRAL_RESUME_FROM")
    if resume_from:
        state = load_state(resume_from)
        step, value = int(state["step"]), int(state["value"])
        log(f"resumed at step {step} from {resume_from}")
    else:
        log("starting fresh at step 0")
    log(f"training {args.steps} steps, checkpoint on {sig_name}")

    while step < args.steps:
        if step == args.fail_at_step:
            log(f"failing on purpose at step {step}")
            return 1
        value += step
        step += 1
        time.sleep(args.step_ms / 1000)
        periodic = args.checkpoint_every > 0 and step % args.checkpoint_every == 0
        if requested or periodic:
            try:
                checkpoint(ckpt_dir, rank, step, value, attempt_of(env))
            except OSError as e:  # a full disk, say: the agent records the failure and the steps lost
                log(f"checkpoint at step {step} failed: {e!r}")
                log(f"CORRAL_STEP={step}")  # how far it got: the agent counts the steps lost from it
                if requested:
                    return 1
                continue
            if requested and args.on_checkpoint == "exit":
                log(f"exiting after checkpoint at step {step}")
                return 0
            requested = False
    log(f"done at step {step} value {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
