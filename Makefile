# Every target but `install` runs inside .venv/, which `install` creates on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_FLAGS ?=

.PHONY: install run test lint format bench soak proto clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/nvplugin demo

test: install lint
	$(BIN)/python -m pytest $(PYTEST_FLAGS)

lint: install
	$(BIN)/ruff check nvplugin tests bench proto
	$(BIN)/ruff format --check nvplugin tests bench proto
	$(BIN)/mypy

format: install
	$(BIN)/ruff format nvplugin tests bench
	$(BIN)/ruff check --fix nvplugin tests bench

proto: install
	$(BIN)/python proto/generate.py

bench: install
	$(BIN)/python -m bench

# The reliability scenarios at full scale (tests/reliability/; make test runs them scaled down).
soak: install
	$(BIN)/python -m tests.reliability.soak

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
