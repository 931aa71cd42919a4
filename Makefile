# Every target but `install` runs inside .venv/, which `install` creates on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_FLAGS ?=

# The real-API test tier (tests/realapi/, tests/support/realapi.py): etcd, kube-apiserver and
# kube-scheduler in envtest's layout, from the directory KUBEBUILDER_ASSETS names. Yours wins
# (setup-envtest's, say); else `make test` unpacks the shared archive into .cache/ (checking its
# SHA256SUMS) when it is there. Either way NVPLUGIN_REQUIRE_REAL_API=1 turns a tier that cannot
# start into failures rather than skips. Without both the tier is skipped and said to be.
K8S_VERSION := 1.36.2
K8S_ARCHIVE := ../shared/k8s/kube-$(K8S_VERSION)-linux-amd64.tar.xz
K8S_CACHE   := .cache/k8s
K8S_ASSETS  := $(K8S_CACHE)/kube-$(K8S_VERSION)
ifdef KUBEBUILDER_ASSETS
REAL_API_ENV  := NVPLUGIN_REQUIRE_REAL_API=1
REAL_API_DEPS :=
else ifneq ($(wildcard $(K8S_ARCHIVE)),)
REAL_API_ENV  := KUBEBUILDER_ASSETS=$(abspath $(K8S_ASSETS)) NVPLUGIN_REQUIRE_REAL_API=1
REAL_API_DEPS := $(K8S_ASSETS)/.checked
else
REAL_API_ENV  :=
REAL_API_DEPS :=
endif

.PHONY: install run test test-fast lint format bench soak proto hooks clean real-api-assets e2e-node

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/nvplugin demo

# Everything, lint first: what CI runs (.ci/run).
test: install lint $(REAL_API_DEPS)
	$(REAL_API_ENV) $(BIN)/python -m pytest $(PYTEST_FLAGS)

# Unpack the real-API tier's binaries (see K8S_ARCHIVE above) and print the directory.
real-api-assets: $(K8S_ASSETS)/.checked
	@echo "KUBEBUILDER_ASSETS=$(abspath $(K8S_ASSETS))"

$(K8S_ASSETS)/.checked: $(K8S_ARCHIVE)
	rm -rf $(K8S_ASSETS)
	mkdir -p $(K8S_CACHE)
	tar -xJf $(K8S_ARCHIVE) -C $(K8S_CACHE)
	cd $(K8S_ASSETS) && sha256sum --check --strict --quiet SHA256SUMS
	if [ -f $(dir $(K8S_ARCHIVE))SHA256SUMS.contents ]; then \
	  cmp $(dir $(K8S_ARCHIVE))SHA256SUMS.contents $(K8S_ASSETS)/SHA256SUMS; fi
	touch $@

# While working: the unit and in-process tests, about a minute. Leaves out the tests marked
# process (they start nvplugin or another Python program), slow, or realapi (tests/conftest.py).
test-fast: install
	$(BIN)/python -m pytest -m "not process and not slow and not realapi" --durations=5 $(PYTEST_FLAGS)

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
	$(BIN)/python -m tests.support.reliability.soak

# The image and chart on a real one-node cluster (root; not part of make test): see
# tests/support/realnode/. Binaries from NVPLUGIN_E2E_BIN, else unpacked from ../shared/k8s.
e2e-node: install
	$(BIN)/python -m tests.support.realnode

# The commit-msg hook of CONTRIBUTING.md (subject <= 72 characters, a blank line before the body).
hooks:
	git config core.hooksPath .githooks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .cache
