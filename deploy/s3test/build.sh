#!/usr/bin/env bash
# Builds versitygw, the real S3-compatible server the blob-store tests run against, from the Go
# module proxy (no Docker, no prebuilt-binary download: this network reaches package registries
# only).
#
# Why versitygw: it is a complete S3 API gateway (SigV4 auth, multipart uploads, path-style
# buckets) over a plain directory (its posix backend), Apache-2.0, one `go install` of one module
# -- much smaller than SeaweedFS, and unlike MinIO not AGPL. The tests tamper with a stored object
# by writing the backing file directly, which the posix backend makes trivial.
#
# `go install module@version` builds in module mode from the proxy; the release is pinned in
# deploy/s3test/versitygw-version. Idempotent: the binary is cached under
# ${SANDPOD_S3TEST_DIR:-~/.cache/sandpod/s3test}/versitygw-<version>/bin; a second run only checks
# it. The last line printed is the bin directory (for `BIN=$(build.sh | tail -1)`).
#
# Usage: deploy/s3test/build.sh [--force]
set -euo pipefail
{ # braces: bash parses the whole script before running it, so editing it mid-build is harmless

VGW_VERSION="${SANDPOD_VERSITYGW_VERSION:-$(cat "$(dirname "$0")/versitygw-version")}"
ROOT="${SANDPOD_S3TEST_DIR:-$HOME/.cache/sandpod/s3test}"
BIN="$ROOT/versitygw-$VGW_VERSION/bin"
FORCE="${1:-}"

log() { echo "s3test: $*" >&2; }

if [[ "$FORCE" != "--force" && -x "$BIN/versitygw" ]] && "$BIN/versitygw" --version >/dev/null 2>&1; then
  log "reusing versitygw $VGW_VERSION in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed (needed to build versitygw)"; exit 1; }
log "building versitygw $VGW_VERSION with $(go version) into $BIN"
log "first run: downloads its module graph (~340 MB of sources) and compiles (~5 min on 2 cores)"
started=$SECONDS
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log "downloading modules and compiling (go prints each module it downloads)"
# The version stamp versitygw's own Makefile sets, so `versitygw --version` reports the release.
ldflags="-s -w -X=main.Version=$VGW_VERSION -X=main.Build=module-proxy"
CGO_ENABLED=0 GOBIN="$tmp" nice -n 10 go install -trimpath -ldflags "$ldflags" \
  "github.com/versity/versitygw/cmd/versitygw@$VGW_VERSION"
mv "$tmp/versitygw" "$BIN/versitygw"
log "built versitygw $VGW_VERSION in $((SECONDS - started)) s"
echo "$BIN"
exit 0
}
