"""corral nodeagent."""
