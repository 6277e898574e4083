"""gVisor (``runsc``) as the real node's ``gvisor`` RuntimeClass (tests/k8s/realnode.py).

deploy/envtest/build-gvisor.sh builds ``runsc`` and ``containerd-shim-runsc-v1`` from gVisor's Go
module into ``$SANDPOD_ENVTEST_DIR/gvisor-<version>/bin``. When they are there, realnode.py adds
:func:`containerd_runtime`'s TOML to containerd's config: a CRI runtime ``runsc`` (the handler the
RuntimeClass names) and gVisor's own ``runsc.toml`` beside it. Absent, the node runs as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from k8s.envtest import REPO

__all__ = ["HANDLER", "RUNTIME_CLASS", "containerd_runtime", "gvisor_bin", "missing_gvisor"]

GVISOR_VERSION = (REPO / "deploy/envtest/gvisor-version").read_text().strip()
RUNTIME_CLASS = "gvisor"
HANDLER = "runsc"


# containerd 1.6 (Debian's) reads a shim's `start` output as the bare socket address; shims built
# on containerd 2's library print JSON bootstrap parameters ({"version":2,"address":...}) there.
SHIM_WRAPPER = """#!/bin/sh
for arg in "$@"; do
  if [ "$arg" = start ]; then
    out="$({shim} "$@")" || exit $?
    case "$out" in
      '{{'*) printf '%s' "$out" | sed -n 's/.*"address":"\\([^"]*\\)".*/\\1/p' ;;
      *) printf '%s' "$out" ;;
    esac
    exit 0
  fi
done
exec {shim} "$@"
"""


def gvisor_bin() -> Path:
    """Where build-gvisor.sh put (or will put) runsc and its shim."""
    if explicit := os.environ.get("SANDPOD_GVISOR_BIN"):
        return Path(explicit)
    root = os.environ.get("SANDPOD_ENVTEST_DIR") or str(Path.home() / ".cache/sandpod/envtest")
    return Path(root) / f"gvisor-{GVISOR_VERSION}" / "bin"


def missing_gvisor() -> str | None:
    """None when runsc and its shim are built, else the command that builds them."""
    for name in ("runsc", "containerd-shim-runsc-v1"):
        if not os.access(gvisor_bin() / name, os.X_OK):
            return f"{name} not found in {gvisor_bin()}: run deploy/envtest/build-gvisor.sh"
    return None


def containerd_runtime(cri: str, state: Path) -> str:
    """containerd config lines for the ``runsc`` handler ("" without a runsc build)."""
    if missing_gvisor() is not None:
        return ""
    bin_dir = gvisor_bin()
    state.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("SANDPOD_NODE_GVISOR_SHIM", "runsc")
    flags = ["--platform=systrap", "--ignore-cgroups", f"--debug-log={state}/logs/"]
    if os.environ.get("SANDPOD_NODE_GVISOR_DEBUG"):
        flags += ["--debug", "--strace"]
    if mode in ("runc", "both"):
        wrapper = state / "runsc"
        wrapper.write_text(
            "#!/bin/sh\nexec " + str(bin_dir / "runsc") + " " + " ".join(flags) + ' "$@"\n'
        )
        wrapper.chmod(0o755)
        handler = HANDLER + "-runc" if mode == "both" else HANDLER
        runc = f"""[{cri}.containerd.runtimes.{handler}]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.{handler}.options]
  BinaryName = "{wrapper}"
  SystemdCgroup = false
"""
        if mode == "runc":
            return runc
    else:
        runc = ""
    config = state / "runsc.toml"
    lines = [
        'binary_name = "' + str(bin_dir / "runsc") + '"',
        f'root = "{state / "root"}"',
        "[runsc_config]",
        '  platform = "systrap"',
        '  ignore-cgroups = "true"',
        f'  debug-log = "{state}/logs/"',
    ]
    config.write_text("\n".join(lines) + "\n")
    shim = state / "containerd-shim-runsc-v1"
    shim.write_text(SHIM_WRAPPER.format(shim=bin_dir / "containerd-shim-runsc-v1"))
    shim.chmod(0o755)
    return runc + f"""[{cri}.containerd.runtimes.{HANDLER}]
  runtime_type = "{shim}"
[{cri}.containerd.runtimes.{HANDLER}.options]
  TypeUrl = "io.containerd.runsc.v1.options"
  ConfigPath = "{config}"
"""
