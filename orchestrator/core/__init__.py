"""corral orchestrator/core."""
