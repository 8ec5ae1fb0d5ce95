# The two commands of the README (`make demo`, `make test`) work on a fresh clone: they create the
# virtual environment and install what they need. The venv is rebuilt when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest quick bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/teaagent demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

quick: $(STAMP)
	$(BIN)/pytest -m "not slow" -q

bench: $(STAMP)
	@for name in core signing relay runner agent approver mcp quorum; do echo "== teaagent bench $$name"; $(BIN)/teaagent bench $$name || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
