# One entry point for humans and CI. `make up` brings the platform up; `make check` runs
# everything CI runs (lint, types, import contracts, the whole test suite on a real nats-server).
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
UV ?= $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
PYTHON ?= python3
CC ?= cc

WEB := services/gateway/src/sandpod_gateway/web
NODE_CLIENT := clients/node

.PHONY: install web node-client up check lint types imports test bench vectors openapi clean envtest gvisor s3test chart-crds images cluster-images cluster

$(BIN)/sandpod: pyproject.toml uv.lock */*/pyproject.toml services/*/pyproject.toml
	@$(PYTHON) -m uv --version >/dev/null 2>&1 || command -v uv >/dev/null || \
		{ echo "installing uv (the workspace installer) with pip"; $(PYTHON) -m pip install --quiet 'uv>=0.5' || \
		  $(PYTHON) -m pip install --quiet --break-system-packages 'uv>=0.5'; }
	$(UV) sync --all-packages --locked
	@touch $@

$(BIN)/sandpod-jail-exec: services/execd/native/jail_exec.c services/execd/native/root_ops.c services/execd/native/seccomp_gen.c $(wildcard /usr/include/seccomp.h) $(BIN)/sandpod
	@# The local runtime's one-step jail entry; without a C compiler execd falls back to sh+nsenter.
	@# Static when libc.a exists: no dynamic loading at every command's entry (~0.2 ms, measured).
	@# The seccomp filters are compiled here with libseccomp (libseccomp-dev) into a header the
	@# helper embeds; without libseccomp the helper loads none and the jails report it degraded
	@# (installing libseccomp-dev later makes the next make install rebuild it: seccomp.h is a prerequisite).
	@# The generator checks its short program against libseccomp's own form of the policy on every
	@# number and argument class; a mismatch fails the build (never a helper without its filter).
	@mkdir -p $(VENV)/build/seccomp && rm -f $(VENV)/build/seccomp/seccomp_bpf.h
	@if ! command -v $(CC) >/dev/null 2>&1; then echo "note: no C compiler: the jail uses the slower sh + nsenter entry, without seccomp"; \
	else if $(CC) -O2 -Wall -Wextra -o $(VENV)/build/seccomp/gen services/execd/native/seccomp_gen.c -lseccomp 2>/dev/null; then \
	  $(VENV)/build/seccomp/gen > $(VENV)/build/seccomp/seccomp_bpf.h.tmp || exit 1; \
	  mv $(VENV)/build/seccomp/seccomp_bpf.h.tmp $(VENV)/build/seccomp/seccomp_bpf.h; \
	else echo "WARNING: libseccomp-dev missing: sandboxes run WITHOUT a seccomp filter (apt-get install libseccomp-dev; make install)"; fi; \
	$(CC) -O2 -Wall -Wextra -I$(VENV)/build/seccomp -static -o $@ $< services/execd/native/root_ops.c 2>/dev/null || $(CC) -O2 -Wall -Wextra -I$(VENV)/build/seccomp -o $@ $< services/execd/native/root_ops.c; fi

FRONT := services/gateway/native
# rustup's cargo when PATH lacks it (a non-login root shell), else Debian's
CARGO ?= $(shell command -v cargo 2>/dev/null || { [ -x $(HOME)/.cargo/bin/cargo ] && echo $(HOME)/.cargo/bin/cargo; } || echo cargo)

$(BIN)/sandpod-front: $(wildcard $(FRONT)/src/*.rs) $(FRONT)/Cargo.toml $(BIN)/sandpod
	@# The gateway's native preview front (hyper + tokio from the crate registry, pinned by
	@# exact versions in Cargo.toml): kept preview admissions relayed without Python (sandpod_gateway/native.py).
	@# Without cargo the gateway relays every request itself, slower, and says so at start.
	@if command -v $(CARGO) >/dev/null 2>&1; then \
	  echo "building sandpod-front (cargo build --release; the first build fetches its crates)"; \
	  $(CARGO) build --release --quiet --manifest-path $(FRONT)/Cargo.toml --target-dir $(VENV)/build/front && \
	  cp $(VENV)/build/front/release/sandpod-front $@.tmp && mv -f $@.tmp $@; \
	else echo "note: no cargo: the gateway relays previews in Python (install cargo, then make install)"; fi

$(WEB)/node_modules/.package-lock.json: $(WEB)/package-lock.json
	@# xterm.js for the gateway's web terminal, from the npm registry (never committed, no CDN)
	npm ci --prefix $(WEB) --no-audit --no-fund

web: $(WEB)/node_modules/.package-lock.json  ## the web terminal's xterm.js (npm ci)

$(NODE_CLIENT)/node_modules/.package-lock.json: $(NODE_CLIENT)/package-lock.json
	@# nats.js + @msgpack/msgpack for the Node client (tests/integration/test_node_client.py)
	npm ci --prefix $(NODE_CLIENT) --no-audit --no-fund

node-client: $(NODE_CLIENT)/node_modules/.package-lock.json  ## the Node.js client's dependencies (npm ci)

install: $(BIN)/sandpod $(BIN)/sandpod-jail-exec $(BIN)/sandpod-front web node-client  ## .venv with every package (editable), dev tools, the jail entry helper, the gateway's native front, xterm.js, the Node client's deps

up: install  ## start NATS + execd serving sandbox "default" in the foreground
	$(BIN)/sandpod up

lint: install
	$(BIN)/ruff format --check .
	@# the formatter wins: no opt-outs (restructure the rare ugly case instead)
	@! grep -rnE --include='*.py' '# fmt: (skip|off)' schemas libs services sdk tests bench
	$(BIN)/ruff check .
	@# shell that ships (the holder, deploy scripts) and CI's own; shellcheck: Debian's apt package
	@command -v shellcheck >/dev/null || { echo "make lint needs shellcheck: apt-get install shellcheck (Debian's package)"; exit 1; }
	shellcheck .ci/run $$(git ls-files '*.sh')
	@# the native front: rustfmt's layout and clippy's warnings as errors (where rustup has them)
	@if $(CARGO) fmt --version >/dev/null 2>&1 && $(CARGO) clippy --version >/dev/null 2>&1; then \
	  $(CARGO) fmt --check --manifest-path $(FRONT)/Cargo.toml && \
	  $(CARGO) clippy --quiet --release --manifest-path $(FRONT)/Cargo.toml --target-dir $(VENV)/build/front -- -D warnings; \
	else echo "note: no cargo fmt/clippy: the native front is not linted"; fi

types: install
	$(BIN)/mypy

imports: install
	$(BIN)/lint-imports

envtest:  ## build (or reuse, cached) kube-apiserver + etcd + helm + kube-network-policies + gVisor for the Kubernetes tests (needs Go)
	bash deploy/envtest/build.sh
	bash deploy/envtest/build-helm.sh
	bash deploy/envtest/build-netpol.sh
	bash deploy/envtest/build-gvisor.sh

gvisor:  ## build (or reuse, cached) gVisor's runsc + containerd shim for the real node's `gvisor` RuntimeClass (part of envtest; needs Go)
	bash deploy/envtest/build-gvisor.sh

s3test:  ## build (or reuse, cached) versitygw, the real S3 server the blob-store tests run against (needs Go)
	bash deploy/s3test/build.sh

images: install  ## the project's images as OCI layouts in build/images/ without Docker (sandpod-execd, sandpod-base); PYTHON_HOME=<relocatable CPython> for the execd bundle (default: uv's managed 3.11)
	@# The Debian base's mmdebstrap tarball is cached in ~/.cache/sandpod/images (built once, ~2 min).
	@# With SANDPOD_IMAGE_REGISTRY=host[:port]/prefix set, each image is also pushed there (our own push code;
	@# credentials from the Docker config.json, SANDPOD_INSECURE_REGISTRIES for plain HTTP beyond loopback).
	$(BIN)/python -m sandpod_image.makeimages --out build/images $(if $(PYTHON_HOME),--python-home $(PYTHON_HOME))

APP_VERSION := $(shell sed -n 's/^appVersion: *"\(.*\)"/\1/p' deploy/helm/sandpod/Chart.yaml)

cluster-images: install build/images/.cluster-$(APP_VERSION)  ## the images a real test node runs (tests/node, make cluster), tagged with the chart's appVersion; rebuilt when their sources change

# Rebuilt only when a file the images are made of changed (the node tests run these images: stale
# ones would test old code). execd's bundle runs Debian's python3.11 (no standalone CPython to
# download here); zstd layers (containerd >= 1.5 reads them) keep the rebuild short.
build/images/.cluster-$(APP_VERSION): $(shell git ls-files libs services schemas/python deploy/images uv.lock 2>/dev/null)
	$(BIN)/python -m sandpod_image.makeimages --out build/images --python-home host --tag $(APP_VERSION) --compress zstd --only execd,base,services,node
	touch $@

cluster: envtest cluster-images  ## a real single-node Kubernetes cluster (kubelet, containerd, CNI) until Ctrl-C; prints its KUBECONFIG
	cd tests && ../$(BIN)/python -m k8s.realnode

chart-crds:  ## copy schemas/crds/ into the Helm chart (tests/k8s/test_helm.py fails on drift)
	cp schemas/crds/*.yaml deploy/helm/sandpod/crds/

# Test processes at once (pytest-xdist): the suite mostly waits on processes, sockets and the
# kernel, so 3 workers on 2 cores finish sooner; each worker starts its own nats-server and API
# server; tests that share a host-wide thing (a real node, the rootless user) are grouped by path
# (XDIST_GROUPS in tests/conftest.py). TEST_WORKERS=0: one process.
# Schemathesis gives its 49 fuzzed operations one node id, which the grouped scheduler would run
# once: they run in a second, one-process pytest.
TEST_WORKERS ?= 3
FUZZ := tests/integration/test_gateway_openapi.py::test_fuzzed_requests_never_hit_a_server_error
test: install envtest s3test cluster-images  ## the whole test suite against a real nats-server (and kube-apiserver, versitygw)
	@# the native front's own tests (its pass decoding on native/vectors.json, which the Python
	@# side's tests/unit/test_front_wire.py reads too); the gateway tests run it for real
	@if [ -x $(BIN)/sandpod-front ]; then $(CARGO) test --quiet --release --manifest-path $(FRONT)/Cargo.toml --target-dir $(VENV)/build/front; fi
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --deselect $(FUZZ)
	$(BIN)/pytest $(FUZZ)

check: lint types imports test  ## everything CI runs

vectors: install  ## regenerate schemas/ (JSON Schemas, vectors, catalogues) from the binding
	$(BIN)/python -m sandpod_contract.schemagen

bench: install  ## benchmarks: print measured floors and ratios
	$(BIN)/python bench/exec_latency.py
	$(BIN)/python bench/stream_throughput.py
	$(BIN)/python bench/gateway_exec.py
	$(BIN)/python bench/cli_start.py

openapi: install  ## regenerate schemas/openapi/gateway.json from the gateway
	$(BIN)/python -m sandpod_gateway openapi > schemas/openapi/gateway.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache $(WEB)/node_modules $(NODE_CLIENT)/node_modules
