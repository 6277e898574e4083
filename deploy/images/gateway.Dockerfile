# syntax=docker/dockerfile:1
# sandpod-gateway: the HTTP + WebSocket API and web terminal (listens on SANDPOD_GATEWAY_PORT, 8080).
# Build from the repository root (the uv workspace is the build context):
#   docker build -f deploy/images/gateway.Dockerfile -t ghcr.io/sandpod/sandpod-gateway:0.1.0 .
# Two stages: uv installs exactly sandpod-gateway and its locked dependencies (uv.lock, no dev
# tools, not editable) into /opt/sandpod; the runtime stage is python:3.11-slim plus that venv,
# run as an unprivileged user. Works with a read-only root filesystem (HOME and state in /tmp).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9
ARG NODE_IMAGE=node:22-bookworm-slim
ARG RUST_IMAGE=rust:1-bookworm

FROM ${UV_IMAGE} AS uv

# The web terminal's xterm.js from the npm registry (package-lock.json pins it; never a CDN).
FROM ${NODE_IMAGE} AS web
WORKDIR /web
COPY services/gateway/src/sandpod_gateway/web/package.json services/gateway/src/sandpod_gateway/web/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY services/gateway/src/sandpod_gateway/web/terminal.html ./

# sandpod-front, the native preview front (services/gateway/native; crates from the registry,
# Cargo.toml pins their versions); the gateway finds it on PATH and starts it.
FROM ${RUST_IMAGE} AS front
WORKDIR /front
COPY services/gateway/native/ ./
RUN cargo build --release

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/sandpod
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --no-dev --no-editable --package sandpod-gateway

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 sandpod \
 && useradd --system --uid 10001 --gid sandpod --home-dir /tmp --no-create-home sandpod
COPY --from=build /opt/sandpod /opt/sandpod
COPY --from=web /web /opt/sandpod-web
COPY --from=front /front/target/release/sandpod-front /usr/local/bin/sandpod-front
ENV PATH=/opt/sandpod/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp SANDPOD_STATE_DIR=/tmp/state
USER 10001:10001
EXPOSE 8080
ENV SANDPOD_GATEWAY_HOST=0.0.0.0 SANDPOD_GATEWAY_PORT=8080 SANDPOD_GATEWAY_WEB_DIR=/opt/sandpod-web
CMD ["python", "-m", "sandpod_gateway"]
