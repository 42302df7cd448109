# Set-up is automatic: every target that needs the virtual environment creates it first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
#: Every runtime dependency, transitive ones included, pinned with hashes: what the image installs.
LOCK := requirements.lock

.PHONY: all demo test e2e image release lock lint proto bench clean fuzz-cel

all: test

# The runtime dependencies as the lock pins them (so tests run what the image ships), then the
# package itself and its dev tools.
$(STAMP): pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r $(LOCK)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

demo: $(STAMP)
	$(BIN)/python -m dradriver.demo

# The suite in TEST_WORKERS processes (pytest-xdist), each test file whole in one: its slowest
# tests wait on purpose (an API outage, kill -9 cycles, a GPU's recovery), so two cores run four.
TEST_WORKERS ?= 4
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The real-cluster suite: every test marked `cluster`. It starts a single-node Kubernetes from
# DRADRIVER_E2E_BIN (a directory of binaries; ../shared/k8s is unpacked when it is there) or uses
# the cluster of DRADRIVER_E2E_KUBECONFIG, and deploys the release in DRADRIVER_RELEASE (a
# directory `make release` wrote: its manifests and image archive), built first when unset.
K8S_SHARED := ../shared/k8s
K8S_BIN_DIR := /var/tmp/dradriver-k8s-bin
TREE_VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' src/dradriver/__init__.py)
E2E_RELEASE = build/e2e/dradriver-$(TREE_VERSION)
e2e: $(STAMP)
	@if [ -z "$$DRADRIVER_E2E_BIN$$DRADRIVER_E2E_KUBECONFIG" ] && [ -x $(K8S_SHARED)/unpack.sh ]; then \
		$(K8S_SHARED)/unpack.sh $(K8S_BIN_DIR) >/dev/null; fi
	@if [ -z "$$DRADRIVER_RELEASE" ]; then \
		$(BIN)/python scripts/release.py $(TREE_VERSION) --out $(E2E_RELEASE) >&2 || exit $$?; fi
	DRADRIVER_RELEASE=$${DRADRIVER_RELEASE:-$(CURDIR)/$(E2E_RELEASE)} \
	DRADRIVER_E2E_BIN=$${DRADRIVER_E2E_BIN:-$$([ -z "$$DRADRIVER_E2E_KUBECONFIG" ] && [ -d $(K8S_BIN_DIR) ] && echo $(K8S_BIN_DIR))} \
		$(BIN)/python -m pytest -m cluster $(PYTEST_ARGS)

# The plugin's OCI image as an archive (build/image/dradriver-<version>.oci.tar), without Docker.
image: $(STAMP)
	$(BIN)/python scripts/build_image.py --constraints $(LOCK)

# Everything an operator installs from, in build/release/dradriver-$(VERSION)/: sdist and wheel,
# the image archive, the rendered manifests with the image pinned by digest, SHA256SUMS
# (scripts/release.py says what each file is).
release: $(STAMP)
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z" >&2; exit 2; }
	$(BIN)/python scripts/release.py $(VERSION)

# Rewrite requirements.lock from pyproject.toml's dependencies, for the image's interpreter.
# Pins that still fit are kept; UPGRADE=1 takes the newest versions pyproject.toml allows.
lock: $(STAMP)
	$(BIN)/python scripts/lock.py $(if $(UPGRADE),--upgrade)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts setup.py
	$(BIN)/ruff format --check src tests bench scripts setup.py
	$(BIN)/mypy

# Regenerate the committed gRPC code after editing proto/dra/.
proto: $(STAMP)
	$(BIN)/python scripts/genproto.py

# Long differential run against dra-oracle (DRADRIVER_ORACLE): selectors and allocation scenarios.
# FUZZ_EXAMPLES, FUZZ_SCENARIOS and FUZZ_SEED set the size and seed; counts go to FUZZ_REPORT.
FUZZ_EXAMPLES ?= 20000
FUZZ_SCENARIOS ?= 2000
FUZZ_SEED ?= 14
FUZZ_REPORT ?= fuzz-cel-report.json
fuzz-cel: $(STAMP)
	DRADRIVER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) DRADRIVER_FUZZ_SCENARIOS=$(FUZZ_SCENARIOS) \
	DRADRIVER_FUZZ_SEED=$(FUZZ_SEED) DRADRIVER_FUZZ_REPORT=$(FUZZ_REPORT) \
	$(BIN)/python -m pytest -p no:cacheprovider -o timeout=0 \
	tests/offline/cel/test_cel_differential.py tests/offline/allocation/test_allocation_differential.py $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m pytest bench

clean:
	rm -rf $(VENV) build src/*.egg-info
