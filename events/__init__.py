"""corral events."""
