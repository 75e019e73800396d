"""corral orchestrator."""
