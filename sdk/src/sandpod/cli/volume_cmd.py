"""``sandpod volume create|ls|get|rm``: SandboxVolumes, named storage that outlives sandboxes.

Tables use the SandboxVolume printer columns (NAME, SIZE, PHASE, WRITER, READERS, USED, AGE),
so the CLI and ``kubectl get sandboxvolumes`` agree. Sandboxes mount them with
``sandpod create --volume NAME:/PATH[:ro]``.
"""

from __future__ import annotations

import argparse
from typing import Any

from sandpod.cli._output import add_output, dump
from sandpod.cli.sandbox_cmd import age, render, run
from sandpod.volumes import AsyncVolumes, VolumeInfo

__all__ = ["add_parsers", "volume_table"]


def volume_table(items: list[VolumeInfo]) -> str:
    rows = [("NAME", "SIZE", "PHASE", "WRITER", "READERS", "USED", "AGE")]
    for v in items:
        created = v.object.get("metadata", {}).get("creationTimestamp")
        used = "-" if v.used_bytes is None else f"{v.used_bytes // 1024**2}Mi"
        readers = ",".join(v.readers) or "-"
        rows.append((v.name, v.size, v.phase, v.writer or "-", readers, used, age(created)))
    return render(rows)


def add_parsers(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    common.add_argument("--prefix", help="subject prefix (default: sandpod)")
    common.add_argument("-n", "--namespace", default="default")

    volume = sub.add_parser("volume", help="persistent volumes: create, ls, get, rm")
    verbs = volume.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("create", parents=[common], help="create a volume of a size")
    p.add_argument("name")
    p.add_argument("--size", required=True, help="its quota, e.g. 1Gi (at least 16Mi)")
    p.add_argument("--storage-class", help="Kubernetes: the PVC's StorageClass")
    add_output(p)
    p.set_defaults(
        run=lambda a: run(
            _volumes(a, lambda c: c.create(a.name, size=a.size, storage_class=a.storage_class))
        )
    )
    p = verbs.add_parser("ls", parents=[common], help="list volumes")
    add_output(p)
    p.set_defaults(run=lambda a: run(_volumes(a, lambda c: c.list())))
    p = verbs.add_parser("get", parents=[common], help="show one volume (the whole object)")
    p.add_argument("name")
    add_output(p, (), default="json")
    p.set_defaults(run=lambda a: run(_volumes(a, lambda c: c.get(a.name))))
    p = verbs.add_parser("rm", parents=[common], help="delete volumes and their data")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=lambda a: run(_rm(a)))


async def _volumes(a: argparse.Namespace, call: Any) -> int:
    async with await AsyncVolumes.connect(
        nats_url=a.nats_url, prefix=a.prefix, namespace=a.namespace
    ) as client:
        got = await call(client)
    items = got if isinstance(got, list) else [got]
    if a.output != "table":
        out = [dict(i.object) for i in items]
        print(dump(out if isinstance(got, list) else out[0], a.output))
    else:
        print(volume_table(items))
    return 0


async def _rm(a: argparse.Namespace) -> int:
    async with await AsyncVolumes.connect(
        nats_url=a.nats_url, prefix=a.prefix, namespace=a.namespace
    ) as client:
        for name in a.names:
            await client.delete(name)
            print(f"deleted volume {name} (its data is gone)")
    return 0
