#!/usr/bin/env python3
"""The toy training worker the example jobs run: `orchestrator/demo_worker.py`, which ships with corral.

`python3 examples/worker.py ARGS` runs `python3 -m orchestrator.demo_worker ARGS` (see that
module for what it does and its options); from a checkout where corral is not installed it
imports the module from the checkout.

    python3 examples/worker.py --steps 500 --step-ms 2 [--checkpoint-every 100]
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from orchestrator.demo_worker import main
except ModuleNotFoundError:  # a checkout without corral installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from orchestrator.demo_worker import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
