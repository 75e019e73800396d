"""corral orchestrator/policies."""
