# The two commands of the README (`make demo`, `make test`) work on a fresh clone: they create the
# virtual environment and install what they need. The venv is rebuilt when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Python caches the bytecode it compiles unless PYTHONDONTWRITEBYTECODE is set (some shells and CI
# images set it). make test starts about 500 Python processes (services, commands), and each would
# then compile libs/ and services/ again (0.15 s of CPU for a relay's modules, 11% of their import),
# while each pytest worker would rewrite every test module again (collection: 18 s of CPU instead
# of 7). The caches are written under __pycache__, which git ignores.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test lint typecheck pytest quick bench clean wheelhouse test-compose

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/teaagent demo
	@echo "teaagent is in $(BIN): run '. $(BIN)/activate' to type 'teaagent' in this shell, or call $(BIN)/teaagent."

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Three workers on two cores (a test file stays on one, so a module's cluster starts once): most
# tests wait on processes, sockets and Redis, so two workers left the cores a third idle (8 min 51 s
# of pytest, 1.39 cores busy); three took 8 min 3 s on the same tree and host. A test that waits on
# time (an expired session) is written to pass under that load too. TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 3

pytest: $(STAMP)
	$(BIN)/pytest $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

# mypy runs beside pytest, as a second job: the workers leave part of the two cores idle, and mypy
# on a fresh clone (no cache) takes about 20 s of one core. A failure of either fails make test.
test: lint
	@$(MAKE) --no-print-directory -j2 typecheck pytest

quick: $(STAMP)
	$(BIN)/pytest -m "not slow" -q

bench: $(STAMP)
	@for name in core signing relay runner agent approver mcp quorum; do echo "== teaagent bench $$name"; $(BIN)/teaagent bench $$name || exit 1; done

# The wheels deploy/Dockerfile installs from (the image then needs no index: PIP_NO_INDEX=1).
# setuptools and wheel build the project; async-timeout is what redis-py needs on Debian bookworm's
# Python 3.11.2, which the host's newer Python would not ask for.
wheelhouse: $(STAMP)
	$(BIN)/python -m pip wheel --quiet --wheel-dir deploy/wheelhouse . setuptools wheel 'async-timeout>=4.0.3'

# docker-compose.yml brought up for real on a private Docker engine (tests/compose). Installs
# Debian's docker.io, containerd, runc, docker-compose and debootstrap when missing (as root).
test-compose: $(STAMP)
	sh tests/compose/install-prerequisites.sh
	TEAAGENT_TEST_COMPOSE=1 $(BIN)/pytest tests/compose -v -s

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache deploy/wheelhouse/*.whl
