# clusterctl developer and user entry points. Everything that needs root
# (packages, dockerd, network namespaces) goes through scripts/setup-host.
PYTHON ?= python3
TARGET ?= cpu
NODES ?= 2
INVENTORY ?= inventories/sandbox.yaml
PYTEST_ARGS ?=

.PHONY: help setup image render demo demo-down test check lint golden bench-push bench-launch clean

help:
	@echo "make demo        set up this machine, build the cpu image, start a $(NODES)-node sandbox, run ddp-smoke on it"
	@echo "make check       set up this machine and run the full test suite (what CI runs)"
	@echo "make image TARGET=cpu|ipex|accl|nccl|cambricon|base   build one target's image"
	@echo "make test        run the test suite (machine already set up)"
	@echo "make lint        ruff + hadolint on every rendered Dockerfile"
	@echo "make golden      rewrite the golden Dockerfiles after a reviewed template change"
	@echo "make bench-push / bench-launch   benchmarks (root; create their own sandboxes)"

setup:
	bash scripts/setup-host

image:
	clusterctl build --target $(TARGET)

render:
	clusterctl render --target $(TARGET)

demo: setup
	clusterctl build --target cpu
	clusterctl sandbox up --nodes $(NODES)
	clusterctl launch ddp-smoke --nodes $(INVENTORY)

demo-down:
	clusterctl sandbox down

test:
	$(PYTHON) -m pytest $(PYTEST_ARGS)

check: setup test

lint:
	ruff check src tests benchmarks
	$(PYTHON) -m pytest -q tests/build/test_hadolint.py

golden:
	UPDATE_GOLDEN=1 $(PYTHON) -m pytest -q tests/build/test_golden.py

bench-push:
	$(PYTHON) benchmarks/push.py

bench-launch:
	$(PYTHON) benchmarks/launch.py

clean:
	rm -rf dockerfiles/*/ .pytest_cache
