# syntax=docker/dockerfile:1
# sandpod-pool: warm pools and claims.
# Build from the repository root (the uv workspace is the build context):
#   docker build -f deploy/images/pool.Dockerfile -t ghcr.io/sandpod/sandpod-pool:0.1.0 .
# Two stages: uv installs exactly sandpod-pool and its locked dependencies (uv.lock, no dev
# tools, not editable) into /opt/sandpod; the runtime stage is python:3.11-slim plus that venv,
# run as an unprivileged user. Works with a read-only root filesystem (HOME and state in /tmp).
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
    uv sync --locked --no-dev --no-editable --package sandpod-pool

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 sandpod \
 && useradd --system --uid 10001 --gid sandpod --home-dir /tmp --no-create-home sandpod
COPY --from=build /opt/sandpod /opt/sandpod
ENV PATH=/opt/sandpod/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp SANDPOD_STATE_DIR=/tmp/state
USER 10001:10001
CMD ["python", "-m", "sandpod_pool"]
