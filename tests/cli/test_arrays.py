"""`--array` values as sbatch reads them (orchestrator/cli/arrays.py)."""

from __future__ import annotations

import pytest

from orchestrator.cli.arrays import MAX_ARRAY_SIZE, ArraySpec, ArraySpecError, parse_array


@pytest.mark.parametrize(("text", "want"), [
    ("0-99%8", ArraySpec(tuple(range(100)), 8, "0-99")),
    ("7", ArraySpec((7,), 0, "7")),
    ("1,3,5-7", ArraySpec((1, 3, 5, 6, 7), 0, "1,3,5-7")),
    ("0-20:5%2", ArraySpec((0, 5, 10, 15, 20), 2, "0-20:5")),
    ("3,1-3", ArraySpec((1, 2, 3), 0, "3,1-3")),
])
def test_what_it_reads(text: str, want: ArraySpec) -> None:
    assert parse_array(text) == want


@pytest.mark.parametrize(("text", "says"), [
    ("0-9%0", "the limit after % must be a whole number of at least 1"),
    ("0-9%x", "the limit after %"),
    ("a-b", "is not an index, a range A-B or A-B:STEP"),
    ("9-0", "must run upwards"),
    ("-1", "is not an index"),
    ("0-9:0", "with a positive step"),
    (f"0-{MAX_ARRAY_SIZE}", f"more than {MAX_ARRAY_SIZE} elements"),
    ("", "is not an index"),
])
def test_what_it_refuses(text: str, says: str) -> None:
    with pytest.raises(ArraySpecError, match=None) as e:
        parse_array(text)
    assert says in str(e.value)
