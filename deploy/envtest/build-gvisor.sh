#!/usr/bin/env bash
# Builds gVisor's `runsc` and its containerd shim (`containerd-shim-runsc-v1`) for the real test
# node's `gvisor` RuntimeClass (tests/k8s/nodegvisor.py), from the Go module proxy: no Docker, no
# prebuilt-binary download (this network reaches package registries only).
#
# gVisor's Go module is its `go` branch (Bazel-free sources the project publishes for `go get`),
# pinned as a pseudo-version in deploy/envtest/gvisor-version. `go install module/pkg@version`
# builds both in module mode through Go's own module-proxy configuration (GOPROXY); runsc and the
# shim must come from the same commit. Optional: only tests/node/test_real_gvisor.py needs it.
#
# Idempotent: the binaries are cached under
# ${SANDPOD_ENVTEST_DIR:-~/.cache/sandpod/envtest}/gvisor-<version>/bin (the same cache as
# build.sh); a second run only checks them. The last line printed is the bin directory.
#
# Usage: deploy/envtest/build-gvisor.sh [--force]
set -euo pipefail
{ # braces: bash parses the whole script before running it, so editing it mid-build is harmless

GVISOR_VERSION="${SANDPOD_GVISOR_VERSION:-$(cat "$(dirname "$0")/gvisor-version")}"
ROOT="${SANDPOD_ENVTEST_DIR:-$HOME/.cache/sandpod/envtest}"
BIN="$ROOT/gvisor-$GVISOR_VERSION/bin"
FORCE="${1:-}"

log() { echo "build-gvisor: $*" >&2; }

if [[ "$FORCE" != "--force" && -x "$BIN/runsc" && -x "$BIN/containerd-shim-runsc-v1" ]] &&
  "$BIN/runsc" --version >/dev/null 2>&1 && "$BIN/containerd-shim-runsc-v1" -v >/dev/null 2>&1; then
  log "reusing runsc and containerd-shim-runsc-v1 $GVISOR_VERSION in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed (needed to build runsc)"; exit 1; }
log "building runsc + containerd-shim-runsc-v1 $GVISOR_VERSION with $(go version) into $BIN" \
  "(~3 min with warm Go caches, ~8 min cold, on 2 cores)"
started=$SECONDS
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# CGO off as gVisor's own release build: runsc is a static binary that re-executes itself.
CGO_ENABLED=0 GOBIN="$tmp" nice -n 10 go install -trimpath -ldflags "-s -w" \
  "gvisor.dev/gvisor/runsc@$GVISOR_VERSION" "gvisor.dev/gvisor/shim@$GVISOR_VERSION"
mv "$tmp/runsc" "$BIN/runsc"
mv "$tmp/shim" "$BIN/containerd-shim-runsc-v1"
log "built runsc and containerd-shim-runsc-v1 in $((SECONDS - started)) s"
echo "$BIN"
exit 0
}
