"""Where shared/fixtures/ is: in the checkout, beside it (CI), or the developer's /work/shared."""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def _find() -> Path:
    candidates = [os.environ.get("CORRAL_FIXTURES", ""), _REPO / "shared" / "fixtures"]
    candidates += [_REPO.parent / "shared" / "fixtures", "/work/shared/fixtures"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    raise RuntimeError(f"shared/fixtures not found (tried {candidates}); set CORRAL_FIXTURES")


FIXTURES = _find()
