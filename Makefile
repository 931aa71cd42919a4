# Every target but `install` runs inside .venv/, which `install` creates on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_FLAGS ?=

.PHONY: install run test lint format bench proto clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/nvplugin topo --simulate dgx-a100

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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
