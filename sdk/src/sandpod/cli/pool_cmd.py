"""``sandpod pool create|ls|get|scale|rm``, ``sandpod claim``, ``claims`` and ``release``.

Pool tables use the SandboxWarmPool printer columns (NAME, TEMPLATE, DESIRED, READY, AVAILABLE,
STATUS, AGE) and claim tables the SandboxClaim ones (NAME, PHASE, POOL, SANDBOX, BOUND, EXPIRES,
AGE), so the CLI and ``kubectl get sandboxwarmpools,sandboxclaims`` agree.
"""

from __future__ import annotations

import argparse
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.cli._output import add_output, dump
from sandpod.cli.sandbox_cmd import age, pairs, render, run
from sandpod.pools import AsyncPools, ClaimInfo, PoolInfo

__all__ = ["add_parsers", "claim_table", "pool_table"]


def pool_table(items: list[PoolInfo]) -> str:
    rows = [("NAME", "TEMPLATE", "DESIRED", "READY", "AVAILABLE", "STATUS", "AGE")]
    for p in items:
        created = p.object.get("metadata", {}).get("creationTimestamp")
        rows.append(
            (
                p.name,
                p.template or "-",
                str(p.replicas),
                str(p.ready),
                str(p.available),
                p.status or "-",
                age(created),
            )
        )
    return render(rows)


def claim_table(items: list[ClaimInfo]) -> str:
    rows = [("NAME", "PHASE", "POOL", "SANDBOX", "BOUND", "EXPIRES", "AGE")]
    for c in items:
        created = c.object.get("metadata", {}).get("creationTimestamp")
        rows.append(
            (
                c.name,
                c.phase,
                c.pool or "-",
                c.sandbox or "-",
                c.bound_reason or "-",
                age(c.shutdown_time, future=True),
                age(created),
            )
        )
    return render(rows)


def add_parsers(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    common.add_argument("--prefix", help="subject prefix (default: sandpod)")
    common.add_argument("-n", "--namespace", default="default")

    pool = sub.add_parser("pool", help="warm pools: create, ls, get, scale, rm")
    verbs = pool.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("create", parents=[common], help="create or update a warm pool")
    p.add_argument("name")
    p.add_argument("--template", help="SandboxTemplate of the members (default: built-in)")
    p.add_argument("--replicas", type=int, default=1, help="ready sandboxes to keep (default 1)")
    p.add_argument(
        "--strategy",
        default="RollingUpdate",
        choices=["RollingUpdate", "Recreate", "OnClaim"],
        help="what a template change does to free members",
    )
    add_output(p)
    p.set_defaults(
        run=lambda a: run(
            _pools(
                a,
                lambda c: c.create(
                    a.name, template=a.template, replicas=a.replicas, strategy=a.strategy
                ),
            )
        )
    )
    p = verbs.add_parser("ls", parents=[common], help="list warm pools")
    add_output(p)
    p.set_defaults(run=lambda a: run(_pools(a, lambda c: c.list())))
    p = verbs.add_parser("get", parents=[common], help="show one pool (the whole object)")
    p.add_argument("name")
    add_output(p, (), default="json")
    p.set_defaults(run=lambda a: run(_pools(a, lambda c: c.get(a.name))))
    p = verbs.add_parser("scale", parents=[common], help="set a pool's replicas")
    p.add_argument("name")
    p.add_argument("replicas", type=int)
    add_output(p)
    p.set_defaults(run=lambda a: run(_pools(a, lambda c: c.scale(a.name, a.replicas))))
    p = verbs.add_parser("rm", parents=[common], help="delete pools and their free members")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=lambda a: run(_rm_pools(a)))

    p = sub.add_parser("claim", parents=[common], help="claim a ready sandbox from a pool")
    p.add_argument("pool", nargs="?", help="SandboxWarmPool (omit with --template: cold)")
    p.add_argument("--template", help="claim a cold sandbox of this template (no pool)")
    p.add_argument("--timeout", type=float, help="claim lifetime in seconds (default: template's)")
    p.add_argument("--idle-timeout", type=int, help="expire after N idle seconds (0: never)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for ready")
    p.add_argument("-l", "--label", action="append", default=[], metavar="K=V")
    p.add_argument("-e", "--env", action="append", default=[], metavar="K=V")
    add_output(p, ("table", "id"))
    p.set_defaults(run=lambda a: run(_claim(a)))
    p = sub.add_parser("claims", parents=[common], help="list claims")
    add_output(p)
    p.set_defaults(run=lambda a: run(_pools(a, lambda c: c.claims())))
    p = sub.add_parser("release", parents=[common], help="end claims (their sandboxes go)")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=lambda a: run(_release(a)))


async def _pools(a: argparse.Namespace, call: Any) -> int:
    """Run ``call`` on a pools client and print what it returned: one object or a list, as
    the printer-column table or (``-o json|yaml``) the whole objects."""
    async with await AsyncPools.connect(
        nats_url=a.nats_url, prefix=a.prefix, namespace=a.namespace
    ) as client:
        got = await call(client)
    items = got if isinstance(got, list) else [got]
    if a.output != "table":
        out = [dict(i.object) for i in items]
        print(dump(out if isinstance(got, list) else out[0], a.output))
    elif items and isinstance(items[0], ClaimInfo):
        print(claim_table(items))
    else:
        print(pool_table(items))
    return 0


async def _rm_pools(a: argparse.Namespace) -> int:
    async with await AsyncPools.connect(
        nats_url=a.nats_url, prefix=a.prefix, namespace=a.namespace
    ) as client:
        for name in a.names:
            await client.delete(name)
            print(f"deleted pool {name} (its free members go; claimed ones stay)")
    return 0


async def _release(a: argparse.Namespace) -> int:
    async with await AsyncPools.connect(
        nats_url=a.nats_url, prefix=a.prefix, namespace=a.namespace
    ) as client:
        for name in a.names:
            info = await client.release(name)
            print(f"released {name} (sandbox {info.sandbox or '-'} deleted)")
    return 0


async def _claim(a: argparse.Namespace) -> int:
    if a.pool is None and a.template is None:
        raise SystemExit("error: name a pool, or --template for a cold sandbox")
    sbx = await AsyncSandbox.claim(
        a.pool,
        template=a.template,
        timeout=a.timeout,
        idle_timeout=a.idle_timeout,
        labels=pairs(a.label, "--label"),
        env=pairs(a.env, "--env"),
        wait=a.wait,
        nats_url=a.nats_url,
        prefix=a.prefix,
    )
    async with sbx:
        info = sbx.claim_info
        if info is None:  # a claim always carries its info; a server bug must not crash here
            raise SystemExit("sandpod claim: the pool answered without the claim's details")
        if a.output == "id":
            print(sbx.id)
        elif a.output in ("json", "yaml"):
            print(dump(dict(info.object), a.output))
        else:
            print(claim_table([info]))
    return 0
