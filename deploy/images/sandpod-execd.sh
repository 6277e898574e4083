#!/bin/sh
# Launcher of the self-contained execd bundle: the bundled interpreter and packages, found
# relative to this script, so the bundle works wherever it is copied (deploy/images/execd.Dockerfile).
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$here/site${PYTHONPATH:+:$PYTHONPATH}" exec "$here/python/bin/python3" -m sandpod_execd "$@"
