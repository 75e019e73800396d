"""A fake pynvml driven by a scenario file: the NVML functions the health watch calls, for GPU-less machines.

Selected the way fake GPUs are (`corral agent --fake-gpus N --fake-nvml FILE`,
`corral up --fake-nvml FILE`): `FakeNvml` stands where the pynvml module does
and answers for the node's N simulated GPUs (UUIDs from
`fake_gpus.fake_gpu_uuid`). Constants and exceptions are pynvml's own
(`NVMLError(NVML_ERROR_GPU_IS_LOST)` is the real `NVMLError_GpuIsLost`), so
code that handles the real module's errors handles these.

The scenario file (JSON, or YAML when PyYAML is installed) is read again
whenever it changes, so a test injects a fault by rewriting it:

    {"xids": [{"gpu": 3, "xid": 79}, {"gpu": 1, "xid": 13}],   # delivered once each, in order
     "gpus": {"2": {"ecc_uncorrected": 4,                       # volatile uncorrectable ECC count
                    "remap_pending": true, "remap_failure": false,
                    "retired_pending": false,
                    "nvlink": {"0": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}},
                    "throttle": 64,                             # nvmlClocksEventReason* bits
                    "lost": false,                              # NVML_ERROR_GPU_IS_LOST on every query
                    "gone": false}},                            # not enumerated at all (count drops)
     "unsupported": ["xid_events", "retired_pages"]}            # NotSupported, like the H200 fixture

A missing or empty file is a healthy node. Xids are appended, never edited:
the fake remembers how many it delivered.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from nodeagent.fake_gpus import fake_gpu_uuid


class _Handle:
    """A device handle: equal for the same GPU (the watch compares handles)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Handle) and other.index == self.index

    def __hash__(self) -> int:
        return hash(self.index)


class FakeNvml:
    """pynvml's functions for `count` fake GPUs of `node_id`, faults from `scenario` (a path or None)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, count: int, *, node_id: str = "node-0", scenario: str | Path | None = None,
                 nvlinks: int = 0) -> None:
        self._count = count
        self._uuids = [fake_gpu_uuid(node_id, i) for i in range(count)]
        self._path = Path(scenario) if scenario is not None else None
        self._nvlinks = nvlinks
        self._stamp: tuple[int, int] | None = None
        self._data: dict[str, Any] = {}
        self._delivered = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        """Constants (NVML_*, nvmlEventType*, nvmlClocks*) and exception classes are the real module's."""
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks")):
            return getattr(pynvml, name)
        raise AttributeError(f"the fake NVML has no {name}")

    # --- the scenario -----------------------------------------------------------------

    def _scenario(self) -> dict[str, Any]:
        if self._path is None:
            return {}
        try:
            st = self._path.stat()
        except FileNotFoundError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            text = self._path.read_text()
            try:
                data = json.loads(text) if text.strip() else {}
            except ValueError:
                import yaml

                data = yaml.safe_load(text) or {}
            self._data, self._stamp = data, stamp
        return self._data

    def _gpu(self, i: int) -> dict[str, Any]:
        gpus = self._scenario().get("gpus") or {}
        return dict(gpus.get(str(i)) or gpus.get(i) or {})

    def _unsupported(self, what: str) -> None:
        if what in (self._scenario().get("unsupported") or ()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _check(self, handle: _Handle) -> dict[str, Any]:
        self.calls += 1
        g = self._gpu(handle.index)
        if g.get("lost"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g

    def _present(self) -> list[int]:
        return [i for i in range(self._count) if not self._gpu(i).get("gone")]

    # --- pynvml's functions --------------------------------------------------------------

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._present())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        present = self._present()
        if not 0 <= index < len(present):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(present[index])
        self._check(handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._check(handle)
        return self._uuids[handle.index]

    def nvmlEventSetCreate(self) -> object:
        self._unsupported("event_set")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: object) -> None:
        self._unsupported("xid_events")
        self._check(handle)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        """The next undelivered Xid of the scenario, else NVML_ERROR_TIMEOUT after `timeout_ms`."""
        deadline_s = max(0, timeout_ms) / 1000.0
        step = min(deadline_s, 0.05)
        waited = 0.0
        while True:
            with self._lock:
                xids = list(self._scenario().get("xids") or ())
                if self._delivered < len(xids):
                    x = xids[self._delivered]
                    self._delivered += 1
                    return SimpleNamespace(device=_Handle(int(x["gpu"])), eventType=pynvml.nvmlEventTypeXidCriticalError,
                                           eventData=int(x["xid"]), gpuInstanceId=0, computeInstanceId=0)
            if waited >= deadline_s:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            self._wake.wait(step)  # (a scenario change is seen at the next look)
            waited += step if step > 0 else deadline_s

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        self._unsupported("ecc")
        return int(self._check(handle).get("ecc_uncorrected", 0))

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        self._unsupported("remapped_rows")
        g = self._check(handle)
        return (0, int(g.get("remapped_uncorrectable", 0)), int(bool(g.get("remap_pending"))),
                int(bool(g.get("remap_failure"))))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        self._unsupported("retired_pages")
        return pynvml.NVML_FEATURE_ENABLED if self._check(handle).get("retired_pending") else 0

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._check(handle)
        if link >= self._nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED if self._nvlinks == 0 else
                                   pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:
        g = self._check(handle)
        names = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
        links = g.get("nvlink") or {}
        return int((links.get(str(link)) or links.get(link) or {}).get(names[counter], 0))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return int(self._check(handle).get("throttle", 0))
