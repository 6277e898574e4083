#!/usr/bin/env bash
# Builds the `helm` CLI the chart tests render with, from the Go module proxy (no Docker, no
# prebuilt-binary download: this network reaches package registries only).
#
# `go install module@version` builds in module mode from the proxy; the release is pinned in
# deploy/helm/helm-version. Idempotent: the binary is cached under
# ${SANDPOD_ENVTEST_DIR:-~/.cache/sandpod/envtest}/helm-<version>/bin (the same cache as
# build.sh); a second run only checks it. The last line printed is the bin directory.
#
# Usage: deploy/envtest/build-helm.sh [--force]
set -euo pipefail
{ # braces: bash parses the whole script before running it, so editing it mid-build is harmless

HELM_VERSION="${SANDPOD_HELM_VERSION:-$(cat "$(dirname "$0")/../helm/helm-version")}"
ROOT="${SANDPOD_ENVTEST_DIR:-$HOME/.cache/sandpod/envtest}"
BIN="$ROOT/helm-$HELM_VERSION/bin"
FORCE="${1:-}"

log() { echo "build-helm: $*" >&2; }

if [[ "$FORCE" != "--force" && -x "$BIN/helm" ]] && "$BIN/helm" version --short >/dev/null 2>&1; then
  log "reusing helm $("$BIN/helm" version --short) in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed (needed to build helm)"; exit 1; }
log "building helm $HELM_VERSION with $(go version) into $BIN"
started=$SECONDS
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# The version stamp helm's own Makefile sets, so `helm version` reports the release.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 GOBIN="$tmp" nice -n 10 go install -trimpath -ldflags "$ldflags" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
mv "$tmp/helm" "$BIN/helm"
log "built $("$BIN/helm" version --short) in $((SECONDS - started)) s"
echo "$BIN"
exit 0
}
