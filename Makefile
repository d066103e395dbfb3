# clusterctl developer and user entry points. Everything that needs root
# (packages, dockerd, network namespaces) goes through scripts/setup-host.
#
# Run them as root or as a user with sudo: the steps that need root get
# `sudo` in front only when you are not root already (so `make demo` works
# in a root container without sudo, and `sudo make demo` works too).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# What needs no root runs as you: also under `sudo make demo` (sudo's SUDO_USER), so that
# the demo's run is recorded as yours and `clusterctl runs` shows it to you.
AS_USER := $(shell [ "$$(id -u)" = 0 ] && [ -n "$$SUDO_USER" ] && [ "$$SUDO_USER" != root ] && echo runuser -u "$$SUDO_USER" --)
PYTHON ?= python3
# the virtual environment scripts/setup-host creates from the lock; every
# command below uses its clusterctl and its python, never the machine's
VENV ?= .venv
CLUSTERCTL = $(VENV)/bin/clusterctl
LOCK = requirements/dev.lock
UV ?= uv
UV_ARGS ?=
TARGET ?= cpu
NODES ?= 2
INVENTORY ?= inventories/sandbox.yaml
PYTEST_ARGS ?=
# pytest-xdist workers (tests/fixtures/parallel.py keeps them apart; 0: one process):
# PYTEST_WORKERS for the tiers without sandboxes (`make test-fast`, `make test-newest`),
# SUITE_WORKERS for the whole suite (`make test`, what CI runs); see parallel.py
PYTEST_WORKERS ?= 2
SUITE_WORKERS ?= 2
# the virtual environment of `make test-newest` (newest releases, not the lock)
NEWEST_VENV ?= .venv-newest
BENCH_ARGS ?=

.PHONY: help setup venv image render demo demo-down test test-fast test-newest check docs docs-serve reference lint golden lock bench-plots bench-push bench-launch bench-validate bench-collective bench-scale bench-workdir bench-recovery bench-registry bench-ssh bench-top bench-exec bench-peers clean

help:
	@echo "make demo        set up this machine, build the cpu image, start a $(NODES)-node sandbox, run ddp-smoke on it"
	@echo "make demo-down   remove the demo's sandbox and stop the Docker engine setup started (images stay on disk)"
	@echo "make check       set up this machine with a fresh $(VENV) from the lock and run the full test suite (what CI runs)"
	@echo "make image TARGET=cpu|ipex|accl|nccl|cambricon|base   build one target's image"
	@echo "make test        run the test suite with $(VENV) (machine already set up)"
	@echo "make test-fast   the edit loop's tier, on src/: no Docker engine, no sandbox, no root (about 3 minutes)"
	@echo "make test-newest the fast tier in a fresh $(NEWEST_VENV) with the newest releases pyproject.toml allows, not the lock"
	@echo "make docs        build the documentation site into site/ (strict: a broken link or a missing page fails)"
	@echo "make bench-plots redraw docs/benchmarks/img/ from docs/benchmarks/data/ (no root)"
	@echo "make docs-serve  serve the documentation site on http://127.0.0.1:8000 while you edit docs/"
	@echo "make reference   rewrite docs/reference/*.md from the code (after changing a command, option, job or inventory key)"
	@echo "make lint        ruff, hadolint on every rendered Dockerfile, shellcheck on the scripts sent to nodes and scripts/gpu-checks"
	@echo "make golden      rewrite the golden Dockerfiles, sbatch scripts and the nccl smoke dry-run after a reviewed change"
	@echo "make lock        refresh $(LOCK) from pyproject.toml (needs uv; UV_ARGS=--upgrade for newest versions)"
	@echo "make bench-push / bench-launch / bench-collective [BENCH_ARGS=...]   benchmarks (root; create their own sandboxes)"
	@echo "make bench-validate [BENCH_ARGS=...]            inventory validation at 1k/10k/100k nodes (no root)"
	@echo "make bench-scale [BENCH_ARGS=...]               a chatty job on 16 nodes: clusterctl's memory, every line counted (root)"
	@echo "make bench-workdir [BENCH_ARGS=...]             a one-line edit to every rank: launch --workdir vs by hand vs rsync, 1/4/16 nodes (root)"
	@echo "make bench-recovery [BENCH_ARGS=...]            fault -> every rank training again with launch --max-restarts, 4 and 8 nodes + a spare (root)"
	@echo "make bench-registry [BENCH_ARGS=...]            the cpu image to 4/8 nodes: registry pulls vs relay vs push with a registry (root)"
	@echo "make bench-ssh [BENCH_ARGS=...]                 head CPU per node of one login + 3 commands: clusterctl vs paramiko vs OpenSSH multiplexing (root)"
	@echo "make bench-top [BENCH_ARGS=...]                 what clusterctl top costs a running training's step rate (root)"
	@echo "make bench-exec [BENCH_ARGS=...]                a short command on 1/8/16/32 nodes: clusterctl exec (and its eager CLI) vs pdsh vs clush vs an ssh loop (root)"
	@echo "make bench-peers [BENCH_ARGS=...]               the own-project DDP through clusterctl, pdsh+docker, Ray, mpirun and TorchX on Slurm, 2/4 nodes (root)"

setup:
	$(SUDO) env VENV=$(VENV) bash scripts/setup-host

# a fresh virtual environment from the lock, then setup's other steps (what `make check` uses)
venv:
	$(SUDO) env VENV=$(VENV) CLUSTERCTL_FRESH_VENV=1 bash scripts/setup-host

$(CLUSTERCTL):
	@echo "$(CLUSTERCTL) is missing: run 'make setup' first (it creates $(VENV) from $(LOCK))" >&2
	@exit 2

image: $(CLUSTERCTL)
	$(SUDO) $(CLUSTERCTL) build --target $(TARGET)

render: $(CLUSTERCTL)
	$(CLUSTERCTL) render --target $(TARGET)

# build and sandbox up need root; under sudo, sandbox up gives you its key and inventory and
# setup gives you the engine's socket, so the demo's launch (and the README's tour) runs as you
demo: setup
	$(SUDO) $(CLUSTERCTL) build --target cpu
	$(SUDO) $(CLUSTERCTL) sandbox up --nodes $(NODES)
	$(AS_USER) $(CLUSTERCTL) launch ddp-smoke --nodes $(INVENTORY)

# The sandbox goes; so does clusterctl's private Docker engine, but only when
# scripts/setup-host started it (it leaves .clusterctl/engine-started-by-setup).
# The engine's images stay on disk under its data-root for the next `make demo`.
demo-down: $(CLUSTERCTL)
	$(SUDO) $(CLUSTERCTL) sandbox down
	@if [ -f .clusterctl/engine-started-by-setup ]; then \
	  echo "$(strip $(SUDO) $(CLUSTERCTL)) engine down"; \
	  $(SUDO) $(CLUSTERCTL) engine down && $(SUDO) rm -f .clusterctl/engine-started-by-setup; \
	else \
	  echo "the Docker engine was running before setup started; left running (stop clusterctl's own with: $(strip $(SUDO) $(CLUSTERCTL)) engine down)"; \
	fi

# The suite runs with the venv's python (the installed clusterctl, not src/) and
# with the venv's bin/ first on PATH (the tests call clusterctl and hadolint);
# CLUSTERCTL_TEST_INSTALLED=1 makes tests/test_packaging.py check exactly that.
# tests/test_packaging.py runs first and without conftest.py: when a dependency is
# missing, conftest cannot import clusterctl, and this names the module and file.
test: $(CLUSTERCTL)
	$(SUDO) env PATH="$(abspath $(VENV))/bin:$$PATH" CLUSTERCTL_TEST_INSTALLED=1 \
	  $(VENV)/bin/python -m pytest -q --noconftest -p no:cacheprovider tests/test_packaging.py
	$(SUDO) env PATH="$(abspath $(VENV))/bin:$$PATH" CLUSTERCTL_TEST_INSTALLED=1 \
	  $(VENV)/bin/python -m pytest -n $(SUITE_WORKERS) $(PYTEST_ARGS)

# The fast tier, for the edit loop (tests/fixtures/tiers.py): every test that needs no
# Docker engine, no sandbox and not minutes (`pytest --fast` leaves out the docker, sandbox
# and slow markers, which tiers.py also gives every test that uses an engine's or a
# sandbox's fixture, and fails a test that reaches the engine or a sandbox anyway). No root.
# On src/ (PYTHONPATH): the change just made, not the copy installed in $(VENV), also for
# the clusterctl the tests run as a subprocess; tests/test_packaging.py's check of the
# installed package is `make test`'s.
test-fast: $(CLUSTERCTL)
	env PATH="$(abspath $(VENV))/bin:$$PATH" PYTHONPATH="$(abspath src)" \
	  $(VENV)/bin/python -m pytest -q --fast -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The tests without Docker, sandboxes or minutes, in a fresh $(NEWEST_VENV) holding the
# newest release of every dependency pyproject.toml allows (what `pip install` gives a user
# today), not the lock; prints the versions that differ from the lock.  No root.
test-newest:
	VENV=$(NEWEST_VENV) scripts/test-newest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# (test runs in a second make, after venv has re-created $(VENV))
check: venv
	$(MAKE) docs
	$(MAKE) test

# The site: mkdocs.yml; docs/hooks.py checks that docs/reference/ is what the code renders.
docs: $(CLUSTERCTL)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean --site-dir site

docs-serve: $(CLUSTERCTL)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000

# the reference pages, rendered from this checkout's src/ (not the installed copy)
reference: $(CLUSTERCTL)
	$(VENV)/bin/python docs/hooks.py

lint: $(CLUSTERCTL)
	$(VENV)/bin/ruff check src tests benchmarks
	env PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/python -m pytest -q tests/image/test_hadolint.py
	@command -v shellcheck >/dev/null || { echo "make lint needs shellcheck: make setup installs it" >&2; exit 2; }
	shellcheck src/clusterctl/*/scripts/*.sh scripts/gpu-checks

golden: $(CLUSTERCTL)
	UPDATE_GOLDEN=1 $(VENV)/bin/python -m pytest -q tests/image/test_golden.py tests/run/test_slurm_script.py \
		tests/run/test_plan.py::test_ddp_smoke_nccl_dry_run_matches_golden

# The lock: every package of the runtime, the dev extra and the build backend
# (hatchling, from [build-system].requires), pinned with hashes, for every
# Python from requires-python's 3.10 up. `make lock` keeps pins that still
# satisfy pyproject.toml; UV_ARGS=--upgrade moves every pin to the newest.
lock:
	@command -v $(UV) >/dev/null || { echo "make lock needs uv: pip install uv" >&2; exit 2; }
	$(PYTHON) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
	  | $(UV) pip compile --quiet pyproject.toml - --extra dev --universal --python-version 3.10 \
	      --generate-hashes --custom-compile-command "make lock" $(UV_ARGS) -o $(LOCK)

# the benchmark pages' plots: every docs/benchmarks/data/*.json drawn into docs/benchmarks/img/
# (matplotlib, no root, no Docker; the same data gives the same PNG bytes)
bench-plots:
	$(VENV)/bin/python benchmarks/plot.py

bench-push: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/push.py $(BENCH_ARGS)

bench-launch: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/launch.py $(BENCH_ARGS)

bench-ssh: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/ssh_clients.py $(BENCH_ARGS)

bench-validate: $(CLUSTERCTL)
	$(VENV)/bin/python benchmarks/validate.py $(BENCH_ARGS)

bench-collective: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/collective.py $(BENCH_ARGS)

bench-scale: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/scale.py $(BENCH_ARGS)

bench-workdir: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/workdir.py $(BENCH_ARGS)

bench-recovery: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/recovery.py $(BENCH_ARGS)

bench-registry: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/registry.py $(BENCH_ARGS)

bench-exec: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/exec.py $(BENCH_ARGS)

bench-peers: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/peers.py $(BENCH_ARGS)

bench-top: $(CLUSTERCTL)
	$(SUDO) $(VENV)/bin/python benchmarks/top.py $(BENCH_ARGS)

clean:
	rm -rf dockerfiles/*/ .pytest_cache
