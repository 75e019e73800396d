"""What one staging may take (issue #39): bytes, members, compression ratio, time, stall, memory.

A dataset's source is user input: an archive may claim anything and a server
may send anything, as slowly as it likes. Every limit here is enforced while
the bytes stream (never after the fact), and a staging that passes one fails
its job once with the reason (DatasetFailed, `permanent`), not on the next node.
The memory limit is the staging child's RLIMIT_AS (supervise.py), so the data
can never exhaust the agent's own memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GiB = 1 << 30


class LimitExceeded(Exception):
    """A staging passed one of its limits (the message names it, its value, and the agent flag that sets it)."""


@dataclass(frozen=True)
class Limits:
    #: Most bytes an archive may unpack to (headers and file contents; every copy of a hard link is not counted).
    max_bytes: int = 1 << 40
    #: Most bytes fetched from the source (the compressed archive); 0: no limit but `max_bytes`.
    max_fetch_bytes: int = 0
    #: Most members (files, directories, links) one archive may hold.
    max_members: int = 10_000_000
    #: Most unpacked bytes per fetched byte, once past `ratio_floor` unpacked bytes (a decompression bomb).
    max_ratio: float = 100.0
    ratio_floor: int = GiB
    #: Most seconds one staging may take, all of it.
    timeout_s: float = 6 * 3600.0
    #: A fetch receiving fewer than `stall_bytes` in `stall_s` seconds has stalled (a dead or trickling server).
    stall_s: float = 60.0
    stall_bytes: int = 1024
    #: The staging child's address-space limit (RLIMIT_AS); 0: none.
    memory_bytes: int = 2 * GiB

    def with_cache(self, cache_bytes: int) -> Limits:
        """These limits on a node whose cache holds at most `cache_bytes` (0: no limit): nothing larger is
        fetched or unpacked, since it could never be kept."""
        if cache_bytes <= 0:
            return self
        fetch = min(self.max_fetch_bytes, cache_bytes) if self.max_fetch_bytes else cache_bytes
        return replace(self, max_bytes=min(self.max_bytes, cache_bytes), max_fetch_bytes=fetch)

    def fetch_limit(self) -> int:
        return self.max_fetch_bytes or self.max_bytes


class Meter:
    """Counts a staging's bytes and members against its Limits; raises LimitExceeded the moment one is passed."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.fetched = 0
        self.unpacked = 0
        self.written = 0
        self.members = 0

    def fetch(self, n: int) -> None:
        self.fetched += n
        cap = self.limits.fetch_limit()
        if self.fetched > cap:
            raise LimitExceeded(f"the source sent more than {cap} bytes, the most a staging may fetch here "
                                "(the node's --dataset-cache-bytes or --dataset-max-bytes)")

    def unpack(self, n: int) -> None:
        """`n` more bytes out of the decompressor (the archive's own bytes, headers included)."""
        self.unpacked += n
        lim = self.limits
        if self.unpacked > lim.max_bytes:
            raise LimitExceeded(f"the archive unpacks to more than {lim.max_bytes} bytes, the most a dataset "
                                "may take here (--dataset-max-bytes, --dataset-cache-bytes)")
        if self.unpacked > lim.ratio_floor and self.unpacked > lim.max_ratio * max(self.fetched, 1):
            raise LimitExceeded(f"the archive unpacks to more than {lim.max_ratio:g} times its size ({self.unpacked} "
                                f"bytes out of {self.fetched}): a decompression bomb? (--dataset-max-ratio)")

    def write(self, n: int) -> None:
        """`n` more bytes of file content to be written (refused before a byte of it is)."""
        self.written += n
        if self.written > self.limits.max_bytes:
            raise LimitExceeded(f"the archive's files hold more than {self.limits.max_bytes} bytes, the most a "
                                "dataset may take here (--dataset-max-bytes, --dataset-cache-bytes)")

    def member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise LimitExceeded(f"the archive holds more than {self.limits.max_members} members "
                                "(--dataset-max-members)")
