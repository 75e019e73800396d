"""What the fold counts of each job array: the numbers a dependency on the whole array is settled by.

A job array is one dependency to its user (`corral submit --after-ok ARRAY`):
the dependent names the array's id once (`Gates.after_ok_arrays`), not its
2,000 elements, and the fold answers it from these counters
(orchestrator/core/array_deps.py) instead of 2,000 dependency edges.
"""

from __future__ import annotations

import msgspec


class ArrayTally(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One array's elements as the log has told them so far."""

    #: Elements the array has, as its elements say (ArrayElement.count); 0 where they do not (older logs).
    declared: int = 0
    #: Elements submitted so far (each counted once, however often its submit was retried).
    submitted: int = 0
    #: Elements ended, however; of those, completed.
    ended: int = 0
    succeeded: int = 0
    #: The first element that ended other than completed, and how ("arr_7 failed"); "" while none did.
    first_failure: str = ""

    @property
    def total(self) -> int:
        """The elements to wait for: as declared, or as many as were submitted (never fewer)."""
        return max(self.declared, self.submitted)

    @property
    def all_ended(self) -> bool:
        return self.submitted >= self.declared and self.ended >= self.submitted

    def progress(self) -> str:
        """"1,234 of 2,000 tasks done" (plus how many are submitted yet, while some are not)."""
        text = f"{self.ended:,} of {self.total:,} tasks done"
        if self.submitted < self.total:
            text += f", {self.submitted:,} submitted"
        return text
