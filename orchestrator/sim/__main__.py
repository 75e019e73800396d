"""`python -m orchestrator.sim ARGS`: an alias of `corral sim ARGS`, whose command is orchestrator/cli/sim.py.

An entry point, not part of the library: no module of orchestrator.sim imports it, so the library
never depends on the CLI (tests/sim/test_layers.py checks that this alias is the one exception).
"""

from __future__ import annotations

import sys

from orchestrator.cli.sim import main

if __name__ == "__main__":
    sys.exit(main())
