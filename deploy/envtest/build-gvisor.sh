#!/usr/bin/env bash
# Builds gVisor's `runsc` and its containerd shim (`containerd-shim-runsc-v1`) for the real test
# node's `gvisor` RuntimeClass (tests/k8s/nodegvisor.py), from gVisor's Go module: no Docker, no
# prebuilt-binary download (this network reaches package registries only).
#
# gVisor's Go module is its `go` branch (Bazel-free sources the project publishes for `go get`),
# pinned as a pseudo-version in deploy/envtest/gvisor-version and fetched through Go's own
# module-proxy configuration (GOPROXY, checksum-verified). The shim needs one patch on this kind
# of host (deploy/envtest/gvisor-shim-oom.patch says why), so both binaries are built from a copy
# of the module with the patch applied, as the main module (its own go.mod and go.sum). runsc and
# the shim come from the same commit. Optional: only tests/node/test_real_gvisor.py needs them.
#
# Idempotent: the binaries are cached under
# ${SANDPOD_ENVTEST_DIR:-~/.cache/sandpod/envtest}/gvisor-<version>/bin (the same cache as
# build.sh), with a stamp naming the patch they carry; a second run only checks them. The last
# line printed is the bin directory.
#
# Usage: deploy/envtest/build-gvisor.sh [--force]
set -euo pipefail
{ # braces: bash parses the whole script before running it, so editing it mid-build is harmless

HERE="$(cd "$(dirname "$0")" && pwd)"
GVISOR_VERSION="${SANDPOD_GVISOR_VERSION:-$(cat "$HERE/gvisor-version")}"
PATCH="$HERE/gvisor-shim-oom.patch"
ROOT="${SANDPOD_ENVTEST_DIR:-$HOME/.cache/sandpod/envtest}"
DIR="$ROOT/gvisor-$GVISOR_VERSION"
BIN="$DIR/bin"
FORCE="${1:-}"

log() { echo "build-gvisor: $*" >&2; }

stamp="$(sha256sum "$PATCH" | cut -c1-16)"
if [[ "$FORCE" != "--force" && -x "$BIN/runsc" && -x "$BIN/containerd-shim-runsc-v1" ]] &&
  [[ "$(cat "$BIN/patch.stamp" 2>/dev/null)" == "$stamp" ]] &&
  "$BIN/runsc" --version >/dev/null 2>&1 && "$BIN/containerd-shim-runsc-v1" -v >/dev/null 2>&1; then
  log "reusing runsc and containerd-shim-runsc-v1 $GVISOR_VERSION in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed (needed to build runsc)"; exit 1; }
command -v git >/dev/null || { log "git is not installed (applies the shim's patch)"; exit 1; }
log "building runsc + containerd-shim-runsc-v1 $GVISOR_VERSION with $(go version) into $BIN" \
  "(~3-8 min on 2 cores the first time)"
started=$SECONDS
export GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
module="$(go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" |
  sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
[[ -n "$module" && -f "$module/go.mod" ]] || { log "could not download gvisor.dev/gvisor@$GVISOR_VERSION"; exit 1; }
rm -rf "$DIR/src"
mkdir -p "$DIR" "$BIN"
cp -r "$module" "$DIR/src"
chmod -R u+w "$DIR/src"
cd "$DIR/src"
if ! git apply -p1 "$PATCH"; then
  log "$(basename "$PATCH") no longer applies to $GVISOR_VERSION: update it with the version"
  exit 1
fi
log "patched pkg/shim/v1/manager.go ($(basename "$PATCH")); compiling"
# CGO off as gVisor's own release build: runsc is a static binary that re-executes itself.
CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$BIN/runsc.new" ./runsc
CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" \
  -o "$BIN/containerd-shim-runsc-v1.new" ./shim
mv "$BIN/runsc.new" "$BIN/runsc"
mv "$BIN/containerd-shim-runsc-v1.new" "$BIN/containerd-shim-runsc-v1"
echo "$stamp" >"$BIN/patch.stamp"
log "built runsc and containerd-shim-runsc-v1 in $((SECONDS - started)) s"
echo "$BIN"
exit 0
}
