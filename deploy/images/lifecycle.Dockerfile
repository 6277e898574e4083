# syntax=docker/dockerfile:1
# sandpod-lifecycle: the controller: Sandboxes -> Pods (cluster mode: SANDPOD_STORE=kube, SANDPOD_RUNTIME=kubernetes).
# Build from the repository root (the uv workspace is the build context):
#   docker build -f deploy/images/lifecycle.Dockerfile -t ghcr.io/sandpod/sandpod-lifecycle:0.1.0 .
# Two stages: uv installs exactly sandpod-lifecycle and its locked dependencies (uv.lock, no dev
# tools, not editable) into /opt/sandpod; the runtime stage is python:3.11-slim plus that venv,
# run as an unprivileged user. Works with a read-only root filesystem (HOME and state in /tmp).
# The same image runs the network guard sidecar of sandbox Pods (python -m
# sandpod_lifecycle.network.podguard, as uid 0 with NET_ADMIN + NET_BIND_SERVICE only: the Pod
# spec sets that), which drives nftables through libnftables1.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/sandpod
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --no-dev --no-editable --package sandpod-lifecycle

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnftables1 \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 sandpod \
 && useradd --system --uid 10001 --gid sandpod --home-dir /tmp --no-create-home sandpod
COPY --from=build /opt/sandpod /opt/sandpod
ENV PATH=/opt/sandpod/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp SANDPOD_STATE_DIR=/tmp/state
USER 10001:10001
CMD ["python", "-m", "sandpod_lifecycle"]
