"""`--array` as Slurm's sbatch reads it: `0-99`, `1,3,5-9`, `0-20:5` (a step), each with `%N` (at most N running)."""

from __future__ import annotations

from typing import NamedTuple

from schemas.jobspec import MAX_ARRAY_INDEX

#: Most elements one `--array` may make: each is a job in the log.
MAX_ARRAY_SIZE = 10_000


class ArraySpec(NamedTuple):
    indexes: tuple[int, ...]
    #: At most this many elements hold GPUs at once; 0: no limit.
    limit: int
    #: As written, without the limit ("0-99"), for display.
    text: str


class ArraySpecError(ValueError):
    pass


def parse_array(text: str) -> ArraySpec:
    """The indexes and limit of an `--array` value; ArraySpecError says what is wrong."""
    body, pct, limit_text = text.strip().partition("%")
    limit = 0
    if pct:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ArraySpecError(f"--array {text!r}: the limit after % must be a whole number of at least 1")
        limit = int(limit_text)
    seen: dict[int, None] = {}
    for part in body.split(","):
        rng, colon, step_text = part.strip().partition(":")
        lo_text, dash, hi_text = rng.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
            step = int(step_text) if colon else 1
        except ValueError:
            raise ArraySpecError(f"--array {text!r}: {part.strip()!r} is not an index, a range A-B or A-B:STEP"
                                 ) from None
        if lo < 0 or hi > MAX_ARRAY_INDEX or lo > hi or step < 1:
            raise ArraySpecError(f"--array {text!r}: {part.strip()!r} must run upwards from 0 to at most "
                                 f"{MAX_ARRAY_INDEX}, with a positive step")
        if (hi - lo) // step + 1 + len(seen) > MAX_ARRAY_SIZE:
            raise ArraySpecError(f"--array {text!r}: more than {MAX_ARRAY_SIZE} elements")
        seen.update(dict.fromkeys(range(lo, hi + 1, step)))
    return ArraySpec(tuple(sorted(seen)), limit, body.strip())
