#!/usr/bin/env bash
# Builds the self-contained execd bundle: sandpod-execd and exactly its locked dependencies
# (uv.lock, no dev tools) as plain packages in <dest>/site, the launcher in <dest>/bin. The
# interpreter goes in <dest>/python (the image copies a standalone CPython there; see
# execd.Dockerfile). Used by execd.Dockerfile and by tests/integration/test_execd_bundle.py, so
# the recipe the image runs is the one the test runs.
#
# Usage (from the repository root): deploy/images/build-execd-bundle.sh <python> <dest>
#   <python>  the interpreter the packages are installed for (compiled extensions match it)
set -euo pipefail
python="$1"
dest="$2"
uv="${UV:-uv}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$dest/bin"
req="$(mktemp)"
trap 'rm -f "$req"' EXIT
# Workspace members come out as ./relative paths, resolved from the repository root (cwd).
$uv export --quiet --locked --no-dev --no-editable --no-hashes --package sandpod-execd -o "$req"
# uv reuses a wheel it built from a local directory until that directory's pyproject.toml
# changes: an edited execd would ship stale (the real-node tests ran an old execd). The
# workspace's own packages are rebuilt every time; the locked ones come from the cache.
refresh=()
while read -r member; do
  name="$(sed -n 's/^name = "\(.*\)"$/\1/p' "$member/pyproject.toml" | head -n 1)"
  refresh+=(--refresh-package "$name")
done < <(grep '^\./' "$req")
$uv pip install --quiet --python "$python" --target "$dest/site" --no-deps "${refresh[@]}" -r "$req"
rm -rf "$dest/site/bin"  # console scripts with absolute shebangs: the launcher replaces them
install -m 0755 "$here/sandpod-execd.sh" "$dest/bin/sandpod-execd"
