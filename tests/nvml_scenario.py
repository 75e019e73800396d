"""A fake NVML scenario file (nodeagent/fake_nvml.py) that tests write: Xid events and per-GPU facts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Scenario:
    """One agent's fake NVML scenario file, rewritten atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"xids": [], "gpus": {}}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)

    def xid(self, gpu: int, xid: int) -> None:
        self.data["xids"].append({"gpu": gpu, "xid": xid})
        self.write()

    def gpu(self, index: int, **facts: Any) -> None:
        self.data["gpus"].setdefault(str(index), {}).update(facts)
        self.write()
