# Set-up is automatic: every target that needs the virtual environment creates it first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all demo test e2e image lint proto bench clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

demo: $(STAMP)
	$(BIN)/python -m dradriver.demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The plugin's OCI image as an archive (build/image/dradriver-<version>.oci.tar), without Docker.
image: $(STAMP)
	$(BIN)/python scripts/build_image.py

# The real-cluster suite: every test marked `cluster`. It starts a single-node Kubernetes from
# DRADRIVER_E2E_BIN (a directory of binaries; ../shared/k8s is unpacked when it is there) or uses
# the cluster of DRADRIVER_E2E_KUBECONFIG, and deploys the image of DRADRIVER_E2E_IMAGE (an
# archive from `make image`; built on the way when unset).
K8S_SHARED := ../shared/k8s
K8S_BIN_DIR := /var/tmp/dradriver-k8s-bin
e2e: $(STAMP)
	@if [ -z "$$DRADRIVER_E2E_BIN$$DRADRIVER_E2E_KUBECONFIG" ] && [ -x $(K8S_SHARED)/unpack.sh ]; then \
		$(K8S_SHARED)/unpack.sh $(K8S_BIN_DIR) >/dev/null; fi
	DRADRIVER_E2E_BIN=$${DRADRIVER_E2E_BIN:-$$([ -z "$$DRADRIVER_E2E_KUBECONFIG" ] && [ -d $(K8S_BIN_DIR) ] && echo $(K8S_BIN_DIR))} \
		$(BIN)/python -m pytest -m cluster $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts setup.py
	$(BIN)/ruff format --check src tests bench scripts setup.py
	$(BIN)/mypy

# Regenerate the committed gRPC code after editing proto/dra/.
proto: $(STAMP)
	$(BIN)/python scripts/genproto.py

bench: $(STAMP)
	$(BIN)/python -m pytest bench

clean:
	rm -rf $(VENV) build src/*.egg-info
