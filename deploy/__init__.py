"""Deployment: NATS configs, compose file, Kubernetes manifests (not part of the installed package)."""
