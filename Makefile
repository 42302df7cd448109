# Set-up is automatic: every target that needs the virtual environment creates it first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all demo test lint proto bench clean fuzz-cel

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

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
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
	tests/cel/test_cel_differential.py tests/cel/test_allocation_differential.py $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m pytest bench

clean:
	rm -rf $(VENV) build src/*.egg-info
