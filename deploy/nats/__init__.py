"""corral's NATS server configs and the permission table they come from."""
