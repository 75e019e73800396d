"""The core's model: the state the fold builds and the cluster facts, capacity, topology, usage and
plan types that both the policies and the decide engine read.

The lowest layer of the core: it imports neither `orchestrator.policies` nor the engine
(`orchestrator.core.*` outside this package), so the contract reads model < policies < engine
(pyproject.toml's import-linter contracts). Import the modules themselves."""
