# make demo | make test | make test-fast | make lint | make bench — each creates or reuses .venv.
# `make demo` installs affidavit as a user would (no dev extras); the other targets add them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
USER_STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-all lint bench clean venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the project metadata changes. The dev install includes the user's.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(USER_STAMP)

$(USER_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(USER_STAMP)

venv: $(STAMP)

demo: $(USER_STAMP)
	$(BIN)/python -m compileall -q src >/dev/null
	$(BIN)/affidavit demo
	@echo
	@echo "affidavit is installed in $(VENV): run $(BIN)/affidavit --help,"
	@echo "or 'source $(BIN)/activate' first and then just: affidavit --help"

# The whole suite, on SQLite and PostgreSQL (AFFIDAVIT_TEST_PG_URL, default the local server).
# The sources are byte-compiled first: the suite starts several hundred `affidavit` processes,
# and where PYTHONDONTWRITEBYTECODE is set each of them would compile every module again.
# Three xdist workers on two cores: much of the suite waits (on subprocesses, leases, a
# restarted server), and a third worker fills those waits (12-13 % faster than -n 2 on the
# runtime and CLI directories, measured back to back; -n 4 was no faster than -n 3).
test: $(STAMP)
	$(BIN)/python -m compileall -q src tests >/dev/null
	$(BIN)/python -m pytest -n 3 -q --durations=20

# The edit loop: SQLite only, no browser, no chaos suite (tests/conftest.py's --fast).
test-fast: $(STAMP)
	$(BIN)/python -m compileall -q src tests >/dev/null
	$(BIN)/python -m pytest -n 3 -q --fast

# Includes the long soak tests.
test-all: $(STAMP)
	$(BIN)/python -m compileall -q src tests >/dev/null
	$(BIN)/python -m pytest -n 3 -q --soak

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m compileall -q src >/dev/null
	$(BIN)/python benchmarks/bench_append.py
	$(BIN)/python benchmarks/bench_steps.py
	$(BIN)/python benchmarks/bench_verify.py
	$(BIN)/python benchmarks/bench_packs.py
	$(BIN)/python benchmarks/bench_claims.py
	$(BIN)/python benchmarks/bench_api.py
	$(BIN)/python benchmarks/bench_mcp.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache affidavit.db affidavit.db-wal affidavit.db-shm
