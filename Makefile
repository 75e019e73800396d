# Two commands a new machine needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck bench clean

# Exact versions from constraints.txt (pyproject.toml has ranges): every machine tests the same.
$(BIN)/corral: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

# A fresh data dir and any free port, so a second run (or a running `corral up`) never interferes.
demo: $(BIN)/corral
	rm -rf .corral/demo
	$(BIN)/corral up --demo --duration 240 --data-dir .corral/demo --port 0

# On pytest-xdist workers: most tests wait on real processes (nats-server, agents, timeouts), not on a
# core, so 4 workers suit even a 2-core machine (tests/conftest.py groups the tests that share a fixture
# and starts the slow ones first). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
test: $(BIN)/corral
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=25

lint: $(BIN)/corral
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(BIN)/corral
	$(BIN)/python bench/replay.py

clean:
	rm -rf $(VENV) .corral .pytest_cache .mypy_cache .ruff_cache
