# syntax=docker/dockerfile:1
# sandpod-execd: the in-sandbox daemon as a self-contained bundle for arbitrary sandbox images.
# Build from the repository root:
#   docker build -f deploy/images/execd.Dockerfile -t ghcr.io/sandpod/sandpod-execd:0.1.0 .
#
# A sandbox runs the user's image (python or not), so execd cannot rely on its interpreter. The
# bundle carries its own: a relocatable CPython (python-build-standalone, installed by uv) plus
# sandpod-execd and its locked dependencies in a plain directory:
#
#   /sandpod-bundle/python/bin/python3     the interpreter (glibc >= 2.17: Debian, Ubuntu, RHEL...)
#   /sandpod-bundle/site/                  sandpod-execd + nats-py, msgpack, structlog, ...
#   /sandpod-bundle/bin/sandpod-execd      launcher (/bin/sh) that finds both relative to itself
#
# The image's default command copies the bundle into /opt/sandpod: the Pod runtime runs it as an
# init container with an emptyDir mounted there, then starts the sandbox container with
#   /opt/sandpod/bin/sandpod-execd
# or, for images without /bin/sh,
#   /opt/sandpod/python/bin/python3 -m sandpod_execd   with PYTHONPATH=/opt/sandpod/site
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9
ARG BUSYBOX_IMAGE=busybox:1.36

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_INSTALL_DIR=/opt/uv-python
WORKDIR /src
COPY . .
# A standalone CPython (relocatable by design), moved into the bundle.
RUN uv python install 3.11 \
 && mkdir -p /sandpod-bundle/bin \
 && cp -a "$(dirname "$(dirname "$(uv python find 3.11 --managed-python)")")" /sandpod-bundle/python
# execd and exactly its locked dependencies (no dev tools) as plain packages, plus the launcher:
# the same script tests/integration/test_execd_bundle.py runs.
RUN --mount=type=cache,target=/root/.cache/uv \
    deploy/images/build-execd-bundle.sh /sandpod-bundle/python/bin/python3 /sandpod-bundle
# Fail the build unless the bundle imports with its own interpreter and packages alone.
RUN PYTHONPATH=/sandpod-bundle/site /sandpod-bundle/python/bin/python3 -c "import sandpod_execd.service"

FROM ${BUSYBOX_IMAGE}
COPY --from=build /sandpod-bundle /sandpod-bundle
USER 65532:65532
# The init container: copy the bundle into the shared emptyDir (mounted at /opt/sandpod).
CMD ["cp", "-a", "/sandpod-bundle/.", "/opt/sandpod/"]
