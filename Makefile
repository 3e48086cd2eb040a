# The single entry point: the README, CI (.ci/run) and developers call these.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DATA_DIR ?= $(CURDIR)/.checkpointd-data
WORKSPACE ?= $(CURDIR)/workspace
PYTEST_ARGS ?=

.PHONY: venv build run test test-python test-rust lint proto bench bench-quick clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(PY)
	$(PIP) install -q "maturin>=1.5,<2"

# Release build of the native module, installed editable with every extra.
build: venv
	$(VENV)/bin/maturin develop --release --extras test,dev -q

# Builds and starts the daemon on the embedded default: SQLite + a local blob dir
# under $(DATA_DIR), serving $(WORKSPACE) on a Unix socket.
run: build
	mkdir -p $(WORKSPACE) $(DATA_DIR)
	$(VENV)/bin/checkpointd serve --workspace $(WORKSPACE) --data-dir $(DATA_DIR)

proto: venv
	$(PY) -m checkpointd.service.genproto

test: build test-rust test-python

test-rust:
	cargo test --release -q --manifest-path rust/Cargo.toml

test-python:
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: build
	$(VENV)/bin/ruff check python tests benchmarks
	$(VENV)/bin/ruff format --check python tests benchmarks
	$(VENV)/bin/mypy
	cargo fmt --all --check
	cargo clippy --release -q --all-targets -- -D warnings

bench: build
	$(PY) -m benchmarks --size full

bench-quick: build
	$(PY) -m benchmarks --size quick

clean:
	rm -rf target $(VENV) .pytest_cache .mypy_cache .ruff_cache
