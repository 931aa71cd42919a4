# Every target but `install` runs inside .venv/, which `install` creates on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_FLAGS ?=

.PHONY: install run test test-fast lint format bench soak proto hooks clean gpu-check

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/nvplugin demo

# Everything, lint first: what CI runs (.ci/run).
test: install lint
	$(BIN)/python -m pytest $(PYTEST_FLAGS)

# While working: the unit and in-process tests, about a minute. Leaves out the tests marked
# process (they start nvplugin or another Python program) or slow (tests/conftest.py).
test-fast: install
	$(BIN)/python -m pytest -m "not process and not slow" --durations=5 $(PYTEST_FLAGS)

lint: install
	$(BIN)/ruff check nvplugin tests bench proto scripts
	$(BIN)/ruff format --check nvplugin tests bench proto scripts
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
	$(BIN)/python -m tests.support.reliability.soak

# On a machine with an NVIDIA driver: capture the node, make and check the CDI spec from the real
# driver root, serve the real NVML to the fake kubelet a few seconds, print a report
# (scripts/gpu_check.py; GPU_CHECK_ARGS="--simulate dgx-a100" runs it without a GPU).
gpu-check: install
	$(BIN)/python scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The commit-msg hook of CONTRIBUTING.md (subject <= 72 characters, a blank line before the body).
hooks:
	git config core.hooksPath .githooks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
