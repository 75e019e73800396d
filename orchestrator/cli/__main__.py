"""`python -m orchestrator.cli`: the same as the `corral` command."""

from orchestrator.cli import main

main()
