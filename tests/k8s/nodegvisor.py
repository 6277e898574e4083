"""gVisor (``runsc``) as the real node's ``gvisor`` RuntimeClass (tests/k8s/realnode.py).

deploy/envtest/build-gvisor.sh builds ``runsc`` and ``containerd-shim-runsc-v1`` from gVisor's Go
module into ``$SANDPOD_ENVTEST_DIR/gvisor-<version>/bin``. When they are there, realnode.py adds
:func:`containerd_runtime`'s TOML to containerd's config: a CRI runtime ``runsc`` (the handler the
RuntimeClass names) whose shim reads ``runsc.toml`` (written here, in the node's run directory)
for runsc's flags. :func:`ensure_runtime_class` creates the RuntimeClass object itself, as a
cluster admin would. Without a build the node runs exactly as before (runc only).

Two things stand between gVisor's shim and this host, both handled here or at build time:

- the shim's ``start`` lowers its daemon's OOM score to -999, which needs CAP_SYS_RESOURCE that
  root lacks here: the build patches it (deploy/envtest/gvisor-shim-oom.patch);
- the shim is built on containerd 2's shim library, whose ``start`` prints JSON bootstrap
  parameters, while Debian's containerd 1.6 reads a bare socket address there: the small
  :data:`SHIM_WRAPPER` containerd runs instead turns one into the other.

runsc runs with the ``systrap`` platform (no KVM here), its own network stack in the Pod's
network namespace and the Pod's cgroups (v1 here; the sandbox process is charged to the Pod).
The Pod's seccomp profile is not applied inside gVisor (runsc's default): gVisor's kernel is the
syscall boundary, itself under runsc's own host filter. ``runsc --oci-seccomp`` would apply it,
but with containerd 1.6's RuntimeDefault profile no thread can start in the sandbox then
(``pthread_create`` fails: "can't start new thread"), so execd's file API breaks;
``SANDPOD_NODE_GVISOR_OCI_SECCOMP=1`` turns it on to see that.
"""

from __future__ import annotations

import os
from pathlib import Path

from k8s.envtest import REPO
from sandpod_kube import KubeSettings

__all__ = [
    "HANDLER",
    "RUNTIME_CLASS",
    "containerd_runtime",
    "ensure_runtime_class",
    "gvisor_bin",
    "missing_gvisor",
]

GVISOR_VERSION = (REPO / "deploy/envtest/gvisor-version").read_text().strip()
RUNTIME_CLASS = "gvisor"
HANDLER = "runsc"
SHIM = "containerd-shim-runsc-v1"

# containerd 1.6 dials whatever a shim's `start` printed as its socket address; a containerd-2
# shim prints {"version":2,"address":"unix:///...","protocol":"ttrpc"}. Every other action
# (the shim daemon itself, `delete`) runs the real binary unchanged.
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
    for name in ("runsc", SHIM):
        if not os.access(gvisor_bin() / name, os.X_OK):
            return f"{name} not found in {gvisor_bin()}: run deploy/envtest/build-gvisor.sh"
    return None


def containerd_runtime(cri: str, state: Path) -> str:
    """containerd config lines for the ``runsc`` handler ("" without a runsc build)."""
    if missing_gvisor() is not None:
        return ""
    bin_dir = gvisor_bin()
    (state / "logs").mkdir(parents=True, exist_ok=True)
    config = state / "runsc.toml"
    flags = {"platform": "systrap", "debug-log": f"{state / 'logs'}/"}  # a log per runsc command
    if os.environ.get("SANDPOD_NODE_GVISOR_OCI_SECCOMP"):
        flags["oci-seccomp"] = "true"
    config.write_text(
        f'binary_name = "{bin_dir / "runsc"}"\nroot = "{state / "root"}"\n[runsc_config]\n'
        + "".join(f'  {key} = "{value}"\n' for key, value in flags.items())
    )
    shim = state / SHIM
    shim.write_text(SHIM_WRAPPER.format(shim=bin_dir / SHIM))
    shim.chmod(0o755)
    # An absolute runtime_type is the shim binary itself (containerd 1.6 ignores runtime_path).
    return f"""[{cri}.containerd.runtimes.{HANDLER}]
  runtime_type = "{shim}"
[{cri}.containerd.runtimes.{HANDLER}.options]
  TypeUrl = "io.containerd.runsc.v1.options"
  ConfigPath = "{config}"
"""


def ensure_runtime_class(settings: KubeSettings) -> None:
    """The ``gvisor`` RuntimeClass (handler ``runsc``), created once per API server."""
    from kubernetes import client

    body = client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=RUNTIME_CLASS), handler=HANDLER)
    with settings.api_client() as api_client:
        try:
            client.NodeV1Api(api_client).create_runtime_class(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
