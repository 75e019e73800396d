"""The agent's GPU health watch: what NVML says about each GPU, as findings the agent puts in the log.

It reads through the pynvml module (`nvml`): the real one on a GPU node, or
`nodeagent.fake_nvml.FakeNvml`, which provides the same functions driven by a
scenario file (`corral agent --fake-gpus N --fake-nvml FILE`). One `poll`:

1. waits up to `wait_ms` for critical Xid events (`nvmlDeviceRegisterEvents`
   with `nvmlEventTypeXidCriticalError`, `nvmlEventSetWait`): an Xid in
   `HealthPolicy.fatal_xids` is fatal, one in `ignored_xids` (application
   errors: the job's fault, not the GPU's) is dropped, any other is a warning;
2. reads each GPU's counters: a GPU NVML reports lost (`NVML_ERROR_GPU_IS_LOST`)
   or that is gone (fewer devices than discovery found), uncorrectable ECC
   errors rising, a row-remapping failure or pending remap, retired pages
   pending, NVLink replay/recovery errors rising (fatal) or CRC errors rising
   (warning), thermal/power throttling (warning).

A query the GPU does not support (the H200 in shared/fixtures/nvml answers
NotSupported to Xid events and retired pages) is skipped for good and listed
in `unsupported`, never a fault. Counters are compared with the first reading,
so errors counted before the agent started are not news; a fatal finding is
made once per GPU and cause, a warning once each time its condition starts.
A lost GPU that answers again, or a pending remap that clears (a reset), makes
a `healthy` finding; an Xid stays until an operator undrains the GPU.

Blocking (NVML calls are): the agent runs `poll` in a thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.events import GPU_FATAL, GPU_WARNING

#: Xids that take a GPU out of service by default (NVIDIA's Xid catalogue): 48 double-bit ECC, 63/64 row
#: remapping / page retirement event or failure, 74 NVLink error, 79 fallen off the bus, 92 high single-bit
#: ECC rate, 94/95 contained / uncontained ECC error, 119/120 GSP RPC timeout / GSP error.
DEFAULT_FATAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
#: Application Xids the NVIDIA device plugin ignores by default: a job's own bug (13 graphics engine
#: exception, 31 MMU fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
#: exception, 109 context switch timeout), so they never drain the GPU.
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

#: Some Xids' meanings, for the reason text (the number is always there).
XID_NAMES = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure", 68: "video processor exception", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 109: "context switch timeout", 119: "GSP RPC timeout", 120: "GSP error",
}

#: Throttle reasons reported as warnings (nvmlClocksEventReason*): HW slowdown, SW/HW thermal, power brake.
THROTTLE_BITS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                 0x80: "hardware power brake"}


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Which Xids are fatal, ignored or (any other) a warning; configurable with documented defaults."""

    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS

    def severity(self, xid: int) -> str | None:
        if xid in self.ignored_xids:
            return None
        return GPU_FATAL if xid in self.fatal_xids else GPU_WARNING


def parse_xids(text: str) -> frozenset[int]:
    """`48,79,94` -> {48, 79, 94}; "" or "none" -> {} (a ValueError names a bad entry)."""
    if text.strip().lower() in ("", "none"):
        return frozenset()
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"not an Xid number: {part!r} (expected e.g. 48,79,94)")
        out.add(int(part))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the watch saw about GPU `index`: unhealthy (fatal or warning) or healthy again."""

    index: int
    uuid: str
    reason: str
    severity: str = GPU_FATAL
    xid: int | None = None
    counter: str = ""
    value: int = 0
    healthy: bool = False
    #: Which cause it is about: a healthy finding clears the fault of the same cause.
    cause: str = ""


@dataclass
class _Gpu:
    index: int
    uuid: str
    handle: Any = None
    ecc_base: int | None = None
    nvlink_base: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Causes of fatal findings made and not cleared, and of warnings whose condition holds.
    fatal: set[str] = field(default_factory=set)
    warned: set[str] = field(default_factory=set)
    #: Undrained by an operator: forget its faults and read its counters afresh at the next poll.
    rebase: bool = False


_NVLINK_FATAL = ("NVML_NVLINK_ERROR_DL_REPLAY", "NVML_NVLINK_ERROR_DL_RECOVERY")
_NVLINK_WARN = ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA")


class GpuHealthWatch:
    """Polls NVML for the GPUs discovery found (`uuids`, by index); see the module docstring."""

    def __init__(self, nvml: Any, uuids: Iterable[str], policy: HealthPolicy | None = None,
                 nvlinks: int | None = None) -> None:
        self.nvml = nvml
        self.policy = policy or HealthPolicy()
        self.gpus = [_Gpu(i, u) for i, u in enumerate(uuids)]
        self._by_uuid = {g.uuid: g for g in self.gpus}
        self._nvlinks = nvlinks
        #: Queries this machine does not support ("gpu0.retired_pages"): skipped from then on.
        self.unsupported: set[str] = set()
        self._events: Any = None
        self.polls = 0
        self.xids_seen = 0
        self._started = False

    # --- set-up ------------------------------------------------------------------------

    def start(self) -> None:
        """nvmlInit, handles, the Xid event set and first counter readings (baselines)."""
        nv = self.nvml
        nv.nvmlInit()
        self._started = True
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self.unsupported.add(f"event_set: {type(e).__name__}")
        for g in self.gpus:
            try:
                g.handle = nv.nvmlDeviceGetHandleByIndex(g.index)
            except nv.NVMLError:
                continue  # found lost at the first poll
            if self._events is not None:
                try:
                    nv.nvmlDeviceRegisterEvents(g.handle, nv.nvmlEventTypeXidCriticalError, self._events)
                except nv.NVMLError as e:
                    self.unsupported.add(f"gpu{g.index}.xid_events: {type(e).__name__}")
            self._baseline(g)

    def _baseline(self, g: _Gpu) -> None:
        """Counters as they are now: only a rise from here is news."""
        nv = self.nvml
        g.fatal.clear()
        g.warned.clear()
        g.ecc_base = self._ecc(g)
        g.nvlink_base = {}
        for link in self._active_links(g):
            for name in (*_NVLINK_FATAL, *_NVLINK_WARN):
                value = self._nvlink_errors(g, link, name)
                if value is not None:
                    g.nvlink_base[(link, getattr(nv, name))] = value

    def close(self) -> None:
        if not self._started:
            return
        nv = self.nvml
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except nv.NVMLError:
                pass
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self._started = False

    # --- one poll ----------------------------------------------------------------------

    def poll(self, wait_ms: int = 0) -> list[Finding]:
        """What is new since the last poll: Xid events (waiting up to `wait_ms` for one), then counters."""
        self.polls += 1
        out = self._xids(wait_ms)
        count = self._device_count()
        for g in self.gpus:
            if g.rebase:
                g.rebase = False
                self._baseline(g)
            out += self._check(g, present=count is None or g.index < count)
        return out

    def _xids(self, wait_ms: int) -> list[Finding]:
        nv = self.nvml
        if self._events is None:
            return []
        out: list[Finding] = []
        timeout = wait_ms
        while True:
            try:
                data = nv.nvmlEventSetWait(self._events, timeout)
            except nv.NVMLError as e:
                if e.value != nv.NVML_ERROR_TIMEOUT:
                    self.unsupported.add(f"event_wait: {type(e).__name__}")
                return out
            timeout = 0  # drain what else is queued, without waiting again
            if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            self.xids_seen += 1
            xid = int(data.eventData)
            g = self._gpu_of(data.device)
            severity = self.policy.severity(xid)
            if g is None or severity is None:
                continue
            cause = f"xid{xid}"
            if severity == GPU_FATAL and cause in g.fatal:
                continue
            if severity == GPU_FATAL:
                g.fatal.add(cause)
            name = XID_NAMES.get(xid)
            out.append(Finding(g.index, g.uuid, f"Xid {xid}" + (f" ({name})" if name else ""), severity, xid=xid,
                               cause=cause))

    def _gpu_of(self, handle: Any) -> _Gpu | None:
        for g in self.gpus:
            if g.handle is not None and g.handle == handle:
                return g
        try:
            uuid = self.nvml.nvmlDeviceGetUUID(handle)
        except self.nvml.NVMLError:
            return None
        return self._by_uuid.get(uuid.decode() if isinstance(uuid, bytes) else uuid)

    def _device_count(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError:
            return None

    def _check(self, g: _Gpu, *, present: bool) -> list[Finding]:
        nv = self.nvml
        lost = not present
        if present:
            try:
                g.handle = nv.nvmlDeviceGetHandleByIndex(g.index)
                nv.nvmlDeviceGetUUID(g.handle)  # a lost GPU fails here with GPU_IS_LOST
            except nv.NVMLError as e:
                lost = e.value == nv.NVML_ERROR_GPU_IS_LOST or isinstance(e, getattr(nv, "NVMLError_GpuIsLost", ()))
                if not lost:
                    return []
        if lost:
            if "lost" in g.fatal:
                return []
            g.fatal.add("lost")
            why = "GPU is lost (NVML_ERROR_GPU_IS_LOST)" if present else "GPU disappeared (not enumerated by NVML)"
            return [Finding(g.index, g.uuid, why, counter="gpu_lost", cause="lost")]
        out: list[Finding] = []
        if "lost" in g.fatal:
            g.fatal.discard("lost")
            out.append(Finding(g.index, g.uuid, "GPU answers NVML again", healthy=True, cause="lost"))
        ecc = self._ecc(g)
        if ecc is not None:
            if g.ecc_base is None:
                g.ecc_base = ecc
            elif ecc > g.ecc_base and "ecc" not in g.fatal:
                g.fatal.add("ecc")
                out.append(Finding(g.index, g.uuid, f"uncorrectable ECC errors rose {g.ecc_base} -> {ecc}",
                                   counter="ecc_uncorrected_volatile", value=ecc, cause="ecc"))
        out += self._remap(g)
        out += self._retired(g)
        out += self._nvlink(g)
        out += self._throttle(g)
        return out

    # --- counters ----------------------------------------------------------------------

    def _query(self, g: _Gpu, what: str, fn_name: str, *args: Any) -> Any:
        """A query's answer, or None when it is not supported here (remembered) or fails this time."""
        key = f"gpu{g.index}.{what}"
        if key in self.unsupported or g.handle is None:
            return None
        nv = self.nvml
        fn = getattr(nv, fn_name, None)
        if fn is None:
            self.unsupported.add(key)
            return None
        try:
            return fn(g.handle, *args)
        except nv.NVMLError as e:
            if e.value in (nv.NVML_ERROR_NOT_SUPPORTED, getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", -1)):
                self.unsupported.add(key)
            return None

    def _ecc(self, g: _Gpu) -> int | None:
        nv = self.nvml
        v = self._query(g, "ecc", "nvmlDeviceGetTotalEccErrors", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        nv.NVML_VOLATILE_ECC)
        return None if v is None else int(v)

    def _remap(self, g: _Gpu) -> list[Finding]:
        rows = self._query(g, "remapped_rows", "nvmlDeviceGetRemappedRows")
        if rows is None:
            return []
        _corr, unc, pending, failure = (int(x) for x in rows)
        out: list[Finding] = []
        if failure and "remap_failure" not in g.fatal:
            g.fatal.add("remap_failure")
            out.append(Finding(g.index, g.uuid, f"row remapping failed ({unc} uncorrectable rows remapped)",
                               counter="remap_failure", value=1, cause="remap_failure"))
        if pending and "remap_pending" not in g.fatal:
            g.fatal.add("remap_pending")
            out.append(Finding(g.index, g.uuid, "row remapping pending: the GPU needs a reset",
                               counter="remap_pending", value=1, cause="remap_pending"))
        elif not pending and "remap_pending" in g.fatal:
            g.fatal.discard("remap_pending")
            out.append(Finding(g.index, g.uuid, "pending row remap done (GPU was reset)", healthy=True,
                               cause="remap_pending"))
        return out

    def _retired(self, g: _Gpu) -> list[Finding]:
        nv = self.nvml
        v = self._query(g, "retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus")
        if v is None or int(v) != nv.NVML_FEATURE_ENABLED or "retired_pending" in g.fatal:
            return []
        g.fatal.add("retired_pending")
        return [Finding(g.index, g.uuid, "retired pages pending: the GPU needs a reset",
                        counter="retired_pages_pending", value=1, cause="retired_pending")]

    def _active_links(self, g: _Gpu) -> list[int]:
        nv = self.nvml
        key = f"gpu{g.index}.nvlink"
        if key in self.unsupported or g.handle is None:
            return []
        links = []
        for link in range(self._nvlinks if self._nvlinks is not None else int(getattr(nv, "NVML_NVLINK_MAX_LINKS",
                                                                                      18))):
            try:
                if nv.nvmlDeviceGetNvLinkState(g.handle, link):
                    links.append(link)
            except nv.NVMLError:
                if link == 0:
                    self.unsupported.add(key)  # a PCIe card: no NVLink at all
                break
        return links

    def _nvlink_errors(self, g: _Gpu, link: int, name: str) -> int | None:
        nv = self.nvml
        try:
            return int(nv.nvmlDeviceGetNvLinkErrorCounter(g.handle, link, getattr(nv, name)))
        except nv.NVMLError:
            return None

    def _nvlink(self, g: _Gpu) -> list[Finding]:
        out: list[Finding] = []
        nv = self.nvml
        for (link, counter), base in list(g.nvlink_base.items()):
            name = next(n for n in (*_NVLINK_FATAL, *_NVLINK_WARN) if getattr(nv, n) == counter)
            value = self._nvlink_errors(g, link, name)
            if value is None or value <= base:
                continue
            short = name.removeprefix("NVML_NVLINK_ERROR_").lower()
            cause = f"nvlink{link}.{short}"
            fatal = name in _NVLINK_FATAL
            if cause in (g.fatal if fatal else g.warned):
                continue  # told once (a warning again only after an undrain re-reads the counters)
            (g.fatal if fatal else g.warned).add(cause)
            out.append(Finding(g.index, g.uuid, f"NVLink {link} {short} errors rose {base} -> {value}",
                               GPU_FATAL if fatal else GPU_WARNING, counter=f"nvlink_{short}", value=value,
                               cause=cause))
        return out

    def _throttle(self, g: _Gpu) -> list[Finding]:
        fn = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self.nvml, fn):
            fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        v = self._query(g, "throttle", fn)
        if v is None:
            return []
        out: list[Finding] = []
        for bit, what in THROTTLE_BITS.items():
            cause = f"throttle{bit:#x}"
            if int(v) & bit:
                if cause not in g.warned:
                    g.warned.add(cause)
                    out.append(Finding(g.index, g.uuid, f"throttled: {what}", GPU_WARNING, counter="clocks_event",
                                       value=int(v), cause=cause))
            else:
                g.warned.discard(cause)
        return out

    def clear(self, index: int) -> None:
        """An operator undrained GPU `index`: its fatal causes may be found (and reported) again."""
        if 0 <= index < len(self.gpus):
            self.gpus[index].rebase = True  # (the polling thread acts on it)
