"""How long a rotated sandbox NATS credential takes to reach execd on a real node.

A sandbox Pod's user JWT lives ``SANDPOD_NATS_CREDS_TTL`` (here ``--ttl``, 60 s by default);
lifecycle re-mints it into the Sandbox's Secret at its half-life, the kubelet's Secret sync
swaps the mounted file, execd's creds watch (a 5 s poll) sees it and reconnects. All of that
must fit in the half-life, or the server drops execd when the old JWT expires. This measures,
for each of ``--rotations`` rotations, from the Secret's rewrite (the API server's watch event):

    file   the container's file became the new one (a watcher in the sandbox, 0.1 s poll)
    conn   the NATS server's connection of execd as the new JWT's user started (connz)

next to the half-life (the floor it must stay under: its ratio is the fraction used) and the
kubelet's ``syncFrequency`` (the node of tests/k8s/realnode.py sets 10 s; ``--sync-frequency 1m``
restarts its kubelet with the upstream default first; ``make cluster-images`` first). The
kubelet rewrites a mounted Secret only when it syncs the Pod (every ``syncFrequency``, plus
jitter), so the half-life must exceed ``syncFrequency`` + execd's 5 s poll with room to spare.
Everything is real: etcd, kube-apiserver, kubelet, containerd, runc, an operator-mode
nats-server; lifecycle runs as a host process with the account seed, as in
tests/node/test_real_creds.py (whose helpers, tests/node/rotation.py, this shares).

    .venv/bin/python bench/creds_rotation.py --real-node [--rotations 4] [--ttl 60]
    .venv/bin/python bench/creds_rotation.py --real-node --sync-frequency 1m --ttl 240
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kubernetes import client

from k8s.cluster import NS, cluster_setup, kube_env
from k8s.envtest import REPO, crd_manifests
from k8s.realnode import RealNode, image, missing_parts
from node.rotation import (
    SWAP_WATCHER,
    Minted,
    Rotation,
    connections,
    minted,
    parse_swaps,
    secret_rewrites,
    timeline,
)
from operator_nats import OperatorNats, kubernetes_service_users
from sandpod import AsyncSandbox
from sandpod_contract.errors import SandpodError
from sandpod_kube import apply_crds
from sandpod_kube.podspec import CREDS_MOUNT

# The smoke run (tests/integration/test_bench_smoke.py): one rotation of a 60 s JWT.
SMOKE_ARGS = ["--real-node", "--rotations", "1"]


def _secret(node: RealNode, name: str) -> client.V1Secret:
    with node.settings.api_client() as api_client:
        return client.CoreV1Api(api_client).read_namespaced_secret(f"{name}-nats-creds", NS)


async def _answering(url: str, prefix: str) -> None:
    async with asyncio.timeout(60):
        while True:
            try:
                await AsyncSandbox.list(nats_url=url, prefix=prefix)
                return
            except Exception:  # no responders yet
                await asyncio.sleep(0.1)


async def _settled(op: OperatorNats, versions: list[Minted]) -> None:
    """Until execd connected as the last version's user, or the one before it expired (then the
    report shows the rotation incomplete): measuring, so a poll of the server's connz."""
    if len(versions) < 2:  # lifecycle re-minted nothing (the sandbox failed?)
        return
    last, before = versions[-1], versions[-2]
    while time.time() < before.expires + 5:
        if connections(await asyncio.to_thread(op.connz), {last.user}):
            return
        await asyncio.sleep(0.2)


def _sync_frequency(node: RealNode) -> str:
    found = re.search(r"^syncFrequency: (\S+)$", (node.dir / "kubelet.yaml").read_text(), re.M)
    return found.group(1) if found else "1m (the kubelet's default)"


def set_sync_frequency(node: RealNode, value: str) -> None:
    """Restart the node's kubelet with another ``syncFrequency`` (before any Pod exists)."""
    config = node.dir / "kubelet.yaml"
    line = f"syncFrequency: {value}"
    text, n = re.subn(r"^syncFrequency: \S+$", line, config.read_text(), flags=re.M)
    config.write_text(text if n else f"{text}{line}\n")
    node.restart_kubelet()
    print(f"node: kubelet restarted with syncFrequency {value}")


def report(rotations: list[Rotation], sync: str) -> None:
    """Print one line per rotation and the ratios to the half-life."""
    if not rotations:
        print("no rotation: lifecycle never rewrote the Secret (0.00x of anything)")
        return
    half = rotations[0].half_life
    print(
        f"JWT lifetime {2 * half:.0f} s (exp - iat): half-life {half:.1f} s; "
        f"kubelet syncFrequency {sync}"
    )
    print("rotation  secret->file  secret->conn  conn/half-life  left before old exp")
    files, conns = [], []
    for i, rot in enumerate(rotations, 1):
        if rot.conn_delay is None or rot.t_conn is None:
            print(f"{i:8}  execd never connected as the new JWT's user")
            continue
        if rot.file_delay is None:
            print(f"{i:8}  {'-':>10}    {rot.conn_delay:10.2f} s  {rot.conn_delay / half:13.2f}x")
            continue
        files.append(rot.file_delay)
        conns.append(rot.conn_delay)
        print(
            f"{i:8}  {rot.file_delay:10.2f} s  {rot.conn_delay:10.2f} s  "
            f"{rot.conn_delay / half:13.2f}x  {rot.old.expires - rot.t_conn:15.1f} s"
        )
    if conns:
        print(
            f"secret->file  mean {statistics.fmean(files):.2f} s, max {max(files):.2f} s = "
            f"{max(files) / half:.2f}x the half-life"
        )
        print(
            f"secret->conn  mean {statistics.fmean(conns):.2f} s, max {max(conns):.2f} s = "
            f"{max(conns) / half:.2f}x the half-life (1.00x: execd dropped at expiry)"
        )


async def run(node: RealNode, tmp: Path, args: argparse.Namespace) -> None:
    assert node.plane is not None and node.net is not None
    (tmp / "nats").mkdir()
    op = OperatorNats(tmp / "nats", node.net.host_ip, monitor=True)
    op.server.start()
    prefix = f"b{os.getpid()}"
    credentials: dict[str, dict[str, str]] = {}
    client_creds, seed = kubernetes_service_users(op, prefix, credentials, tmp)
    os.environ["SANDPOD_NATS_CREDS"] = str(client_creds)  # the SDK's user
    await asyncio.to_thread(cluster_setup, node.settings, op.url)
    env = {
        **os.environ,
        **kube_env(node.plane),
        **credentials["sandpod_lifecycle"],
        "SANDPOD_NATS_URL": op.url,
        "SANDPOD_PREFIX": prefix,
        "SANDPOD_STATE_DIR": str(tmp),
        "SANDPOD_LOG_LEVEL": "warning",
        "SANDPOD_RUNTIME": "kubernetes",
        "SANDPOD_POD_EXECD_IMAGE": image("sandpod-execd"),
        "SANDPOD_POD_DEFAULT_IMAGE": image("sandpod-base"),
        "SANDPOD_READY_TIMEOUT": "300",
        "SANDPOD_RESYNC": "1",
        "SANDPOD_NATS_ACCOUNT_SEED_FILE": str(seed),
        "SANDPOD_NATS_CREDS_TTL": str(args.ttl),
    }
    log = (tmp / "lifecycle.log").open("ab")
    lifecycle = subprocess.Popen(
        [sys.executable, "-m", "sandpod_lifecycle"], env=env, stdout=log, stderr=log
    )
    try:
        await _answering(op.url, prefix)
        sbx = await AsyncSandbox.create(
            name=f"rot-{os.getpid()}", timeout=3600, wait=300, nats_url=op.url, prefix=prefix
        )
        try:
            secret = await asyncio.to_thread(_secret, node, sbx.id)
            first = minted(secret, time.time())
            watcher = await sbx.proc.start(SWAP_WATCHER, proc_id="swaps")
            assert secret.metadata is not None
            rv = str(secret.metadata.resource_version)
            versions = [first] + await asyncio.to_thread(
                secret_rewrites,
                node.settings,
                NS,
                f"{sbx.id}-nats-creds",
                after=rv,
                count=args.rotations,
                timeout=(args.rotations + 2) * args.ttl,
            )
            await _settled(op, versions)
            try:  # execd dropped at an expiry (too long a kubelet sync) answers no more
                await watcher.kill()
                swaps = parse_swaps((await sbx.fs.read("/workspace/swaps")).decode())
                print(f"creds mounted at {CREDS_MOUNT}; sandbox {sbx.id} answered throughout")
            except SandpodError as exc:
                swaps = []
                print(f"the sandbox stopped answering ({exc.code}): no file times")
            conns = connections(op.connz(), {v.user for v in versions})
            rotations = timeline(versions, swaps, conns)[: args.rotations]
            report(rotations, _sync_frequency(node))
            expired = [c for c in conns if "expired" in c.reason.lower()]
            print(f"execd connections the server closed for an expired JWT: {len(expired)}")
        finally:
            await sbx.kill()
            await sbx.close()
    finally:
        lifecycle.terminate()
        lifecycle.wait(60)
        log.close()
        op.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--real-node", action="store_true", help="required: a real kubelet")
    parser.add_argument("--rotations", type=int, default=4)
    parser.add_argument("--ttl", type=int, default=60, help="SANDPOD_NATS_CREDS_TTL (>= 60)")
    parser.add_argument(
        "--sync-frequency",
        default=None,
        help="the kubelet's syncFrequency (e.g. 1m, its default; the node's own: 10s)",
    )
    args = parser.parse_args()
    if not args.real_node:
        raise SystemExit("only --real-node: a rotation goes through the real kubelet's sync")
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    images = REPO / "build" / "images"
    if problem := missing_parts(images):
        raise SystemExit(problem)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        node = RealNode(Path(tmp) / "node", images)
        (Path(tmp) / "node").mkdir()
        node.start(progress=True)
        try:
            if args.sync_frequency:
                set_sync_frequency(node, args.sync_frequency)
            apply_crds(node.settings, crd_manifests())
            asyncio.run(run(node, Path(tmp), args))
        finally:
            node.stop()


if __name__ == "__main__":
    main()
