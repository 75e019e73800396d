"""The scheduler service and what runs beside it: the async shell around the pure core (service.py), its
leadership (leader.py: the lease and the elections), the heartbeat monitor (health.py), its Prometheus
metrics (metrics.py) and the team gateway (gateway.py)."""
