"""The README's screenshots of the web UI (#43): every page at 1280x800, from a real `corral up`.

    python bench/ui_screenshots.py [--out docs/ui]

Starts `corral up` (4 nodes x 8 GPUs, process runtime) in a temporary directory, plays a small
scene on it (prod reclaims its guarantee from research, whose job checkpoints and waits again;
a job array, a dependency, a cordoned node, an operator-drained GPU and one with an Xid), opens
each page in headless Chromium (Debian's chromium and chromium-driver) and writes
cluster.png, queues.png, jobs.png, job.png and history.png, reduced to a 64-colour palette
(Pillow) to keep them small. Needs the dev install (`make`).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser import Browser, chromium_paths  # noqa: E402

CORRAL = [sys.executable, "-m", "orchestrator.cli"]
WORKER = [sys.executable, str(ROOT / "examples" / "worker.py")]


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def corral(url: str, *args: str) -> str:
    return subprocess.run([*CORRAL, "--nats", url, *args], check=True, capture_output=True, text=True, cwd=ROOT).stdout


def submit(url: str, job_id: str, name: str, queue: str, ranks: int, gpus: int, steps: int, *extra: str,
           priority: int = 0) -> None:
    spec = {"name": name, "queue": queue, "ranks": ranks, "gpus_per_rank": gpus, "grace_period_s": 10, "priority": priority,
            "command": [*WORKER, "--steps", str(steps), "--step-ms", "10"]}
    import json

    subprocess.run([*CORRAL, "--nats", url, "submit", "-", "--id", job_id, *extra], input=json.dumps(spec),
                   check=True, capture_output=True, text=True, cwd=ROOT)


async def _gpu_fault(url: str) -> None:
    """An Xid the way a node agent's health watch reports one (a fake GPU has no NVML to raise it)."""
    from events.bus import Bus
    from schemas import GpuUnhealthy

    bus = await Bus.connect(url, name="ui-screenshots")
    try:
        await bus.append(GpuUnhealthy(event_id=uuid.uuid4().hex, occurred_at=time.time(), node_id="node-3",
                                      gpu_index=7, reason="Xid 79 (GPU has fallen off the bus)", xid=79))
    finally:
        await bus.close()


def wait_for(what: str, check: object, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise SystemExit(f"ui_screenshots: timed out waiting for {what}")


def status(url: str, job_id: str) -> str:
    import json

    return str(json.loads(corral(url, "job", job_id, "--json", "--no-index"))["status"])


def scene(url: str) -> str:
    """Play the scene; the id of a job prod preempted (its checkpoint in its story)."""
    import json

    corral(url, "queue", "set", "prod", "--guarantee", "16", "--weight", "2")
    corral(url, "queue", "set", "research", "--weight", "1")
    corral(url, "queue", "set", "interactive", "--weight", "1", "--limit", "4")
    # GPU faults first, so that no job is placed on them (and none is requeued by them).
    corral(url, "gpu", "drain", "node-1:7", "--reason", "fan noise")
    asyncio.run(_gpu_fault(url))
    submit(url, "sweep", "lr-sweep", "research", 1, 2, 100_000, "--array", "0-9%8")
    submit(url, "pretrain", "llm-pretrain", "research", 2, 4, 100_000)
    submit(url, "notebook", "notebook", "interactive", 1, 1, 100_000)
    wait_for("research to fill the cluster", lambda: status(url, "pretrain") == "running")
    time.sleep(4)  # past --min-runtime: research's jobs may be preempted
    submit(url, "finetune", "finetune-7b", "prod", 1, 8, 100_000, priority=100)
    submit(url, "eval", "eval-7b", "prod", 1, 4, 100_000, "--after-ok", "finetune")
    wait_for("the preemption", lambda: status(url, "finetune") == "running")
    corral(url, "node", "cordon", "node-2")
    time.sleep(8)  # a few fair-share samples (one per 5 s) for the queue page's chart
    for job in json.loads(corral(url, "jobs", "--json"))["jobs"]:
        if job["attempt"] > 1 and json.loads(corral(url, "job", job["job_id"], "--json", "--no-index"))["checkpoint"]:
            return str(job["job_id"])
    raise SystemExit("ui_screenshots: prod preempted no job that checkpointed")


def shoot(browser: Browser, ui: str, page: str, out: Path, ready: str, *, then: str | None = None,
          then_ready: str | None = None) -> None:
    """`page` once `ready` (a CSS selector) shows; `then`: a line of JavaScript to run first, until `then_ready`."""
    from PIL import Image

    browser.get(ui + page)
    try:
        browser.wait(page, lambda: browser.js(f"return !!document.querySelector({ready!r})"), timeout=60)
    except AssertionError:
        raise SystemExit(f"ui_screenshots: {page} never showed {ready}: "
                         f"{browser.js('return document.body.innerText')[:2000]}") from None
    if then is not None:
        browser.js(then)
        browser.wait(f"{page} after {then}", lambda: browser.js(f"return !!document.querySelector({then_ready!r})"))
    time.sleep(1.0)
    raw = Path(tempfile.mktemp(suffix=".png"))
    browser.screenshot(raw)
    image = Image.open(raw).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    out.write_bytes(buf.getvalue())
    raw.unlink()
    note(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {len(buf.getvalue()) // 1024} KB")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "ui"), help="directory for the PNGs (default %(default)s)")
    args = p.parse_args()
    found = chromium_paths()
    if found is None:
        raise SystemExit("ui_screenshots: needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="corral-ui-shots-") as d:
        up = subprocess.Popen([*CORRAL, "up", "--port", "0", "--ui-port", "0", "--data-dir", str(Path(d) / "data"),
                               "--min-runtime", "2"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              cwd=ROOT, env={**os.environ, "CORRAL_LOG_LEVEL": "warning"})
        browser = None
        try:
            assert up.stdout is not None
            url = ui = ""
            while not ui:
                line = up.stdout.readline()
                if not line:
                    raise SystemExit("ui_screenshots: corral up exited")
                if "NATS at " in line:
                    url = line.split("NATS at ", 1)[1].split()[0]
                if "web UI at " in line:
                    ui = line.split("web UI at ", 1)[1].split()[0]
            victim = scene(url)
            browser = Browser(*found)
            browser.viewport(1280, 800)
            shoot(browser, ui, "#/cluster", out / "cluster.png", ".gpu.busy")
            shoot(browser, ui, "#/queues", out / "queues.png", "#queue-prod")
            shoot(browser, ui, "#/jobs", out / "jobs.png", "#job-row-pretrain")
            shoot(browser, ui, f"#/job/{victim}", out / "job.png", "#timeline li[data-type=Checkpointed]")
            # The history of the last hour, and the cluster as it was at position #60 (`replay --at #60`).
            shoot(browser, ui, "#/history/1h", out / "history.png", "#waits",
                  then="document.getElementById('at').value = '#60'; historyPage.at(); return 0",
                  then_ready="#at-view .gpu")
        finally:
            if browser is not None:
                browser.close()
            up.terminate()
            up.wait(60)
    import json

    print(json.dumps({"bytes": {p.name: p.stat().st_size for p in sorted(out.glob("*.png"))}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
