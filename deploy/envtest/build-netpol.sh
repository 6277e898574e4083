#!/usr/bin/env bash
# Builds kube-network-policies (sigs.k8s.io/kube-network-policies: a NetworkPolicy agent that works
# with any CNI) for the real test node (tests/k8s/nodepolicy.py), from the Go module proxy, as
# deploy/envtest/build.sh builds the control plane: no Docker, no prebuilt download.
#
# Idempotent: the binary is cached under $SANDPOD_ENVTEST_DIR (default ~/.cache/sandpod/envtest)
# in netpol-<version>/bin; a second run only checks it. The last line printed is the binary's path.
# A cold build compiles client-go v0.32 and its dependencies: measured 26 min with an empty Go
# build cache on two cores shared with a load of ~20; much less on an idle machine.
#
# Usage: deploy/envtest/build-netpol.sh [--force]
set -euo pipefail
{ # braces: bash parses the whole script before running it, so editing it mid-build is harmless

VERSION="${SANDPOD_NETPOL_VERSION:-v0.8.0}"
ROOT="${SANDPOD_ENVTEST_DIR:-$HOME/.cache/sandpod/envtest}"
BIN="$ROOT/netpol-$VERSION/bin"
EXE="$BIN/kube-network-policies"
FORCE="${1:-}"

log() { echo "netpol: $*" >&2; }

# grep reads all of the help: with -q it would exit at the match, the binary would die of SIGPIPE,
# and pipefail would call a good binary missing (a needless rebuild of minutes in some warm runs)
if [[ "$FORCE" != "--force" && -x "$EXE" ]] && "$EXE" -h 2>&1 | grep -- -nfqueue-id >/dev/null; then
  log "reusing kube-network-policies $VERSION in $BIN"
  echo "$EXE"
  exit 0
fi
command -v go >/dev/null || { log "go is not installed (needed to build kube-network-policies)"; exit 1; }
log "building kube-network-policies $VERSION with $(go version) into $BIN"
started=$SECONDS
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" go install "sigs.k8s.io/kube-network-policies/cmd@$VERSION"
mv "$tmp/cmd" "$EXE"
log "built in $((SECONDS - started)) s"
echo "$EXE"
exit 0
}
