"""SandboxVolumes end to end: a real lifecycle service (local runtime) over NATS, the SDK.

A volume is created through the API, mounted by a sandbox that writes into it, outlives that
sandbox, and is read by the next one; the exclusivity rules and deletion are the service's
answers to real requests, and the storage on the host goes with ``volumes.delete``. Tenancy
through real tenant credentials is covered by ``tests/unit/test_volume_claims.py`` (the same
handlers, the tenant from the request context).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_lifecycle import Lifecycle, _ready_api, lifecycles  # noqa: F401 - fixture used by name

from sandpod import AsyncSandbox, AsyncVolumes, VolumeMount
from sandpod.errors import ResourceInvalid, VolumeInUse
from sandpod_lifecycle.runtime.volumes import LocalVolumes

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime's volumes need root (loop devices, the jail)"
)


async def test_a_volume_outlives_its_sandbox_and_is_exclusive(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A writes into volume data and is deleted; B mounts it read-write and reads A's file;
    while B holds it, C (read-write or read-only) is refused naming B, and deleting the volume
    is refused; once B is gone two read-only sandboxes share it and cannot write; deleting it
    then frees its storage on the host."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    conn: dict[str, Any] = {"nats_url": lc.url, "prefix": lc.prefix}
    storage = tmp_path / "jails" / ".volumes" / "default" / "data"
    volumes = await AsyncVolumes.connect(**conn)
    try:
        made = await volumes.create("data", size="64Mi")
        assert made.phase == "Available" and os.path.ismount(storage / "disk")
        with pytest.raises(ResourceInvalid) as bad:
            await volumes.create("tiny", size="1Ki")
        assert bad.value.details["field"] == "spec.size"

        a = await AsyncSandbox.create(volumes=["data:/data"], **conn)
        async with a:
            assert (await volumes.get("data")).writer == a.id
            r = await a.exec("/", "echo kept > /data/note && chmod 644 /data/note")
            assert r.exit_code == 0, r.stderr
            await a.kill()

        b = await AsyncSandbox.create(volumes=[VolumeMount("data", "/mnt/data")], **conn)
        async with b:
            assert (await b.exec("/", "cat /mnt/data/note")).stdout == "kept\n"
            for mount in ("data:/data", "data:/data:ro"):
                with pytest.raises(VolumeInUse) as held:
                    await AsyncSandbox.create(volumes=[mount], **conn)
                assert held.value.details["holders"] == b.id
            with pytest.raises(VolumeInUse):
                await volumes.delete("data")
            listed = await volumes.list()
            assert [(v.name, v.writer) for v in listed] == [("data", b.id)]
            await b.kill()

        r1 = await AsyncSandbox.create(volumes=["data:/data:ro"], **conn)
        r2 = await AsyncSandbox.create(volumes=["data:/data:ro"], **conn)
        async with r1, r2:
            assert set((await volumes.get("data")).readers) == {r1.id, r2.id}
            for sbx in (r1, r2):
                assert (await sbx.exec("/", "cat /data/note")).stdout == "kept\n"
                r = await sbx.exec("/", "echo x > /data/new; echo x >> /data/note")
                assert r.exit_code != 0, r
                assert (await sbx.exec("/", "cat /data/note; ls /data")).stdout == "kept\nnote\n"
            await r1.kill()
            await r2.kill()

        gone = await volumes.delete("data")
        assert gone.name == "data"
        assert not storage.exists()
    finally:
        await volumes.close()
        leftovers = LocalVolumes(tmp_path / "jails")
        for vol in (tmp_path / "jails" / ".volumes" / "default").glob("*"):
            leftovers.remove("default", vol.name)


SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")


def _cli(lc: Lifecycle, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDPOD_NATS_URL": lc.url, "SANDPOD_PREFIX": lc.prefix}
    return subprocess.run(
        [SANDPOD, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


async def test_the_volume_cli(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
    tmp_path: Path,
) -> None:
    """`sandpod volume create|ls|rm` and `sandpod create --volume`: a table with the writer,
    a refused delete that says store.in_use and exits 125, a bad --volume refused early."""
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    try:
        made = await asyncio.to_thread(_cli, lc, "volume", "create", "cli", "--size", "32Mi")
        assert made.returncode == 0, made.stderr
        header, row = made.stdout.splitlines()
        assert header.split() == ["NAME", "SIZE", "PHASE", "WRITER", "READERS", "USED", "AGE"]
        assert row.split()[:3] == ["cli", "32Mi", "Available"]
        box = await asyncio.to_thread(
            _cli, lc, "create", "--name", "clibox", "--volume", "cli:/data", "-o", "json"
        )
        assert box.returncode == 0, box.stderr
        listed = await asyncio.to_thread(_cli, lc, "volume", "ls")
        assert "clibox" in listed.stdout and "InUse" in listed.stdout, listed.stdout
        refused = await asyncio.to_thread(_cli, lc, "volume", "rm", "cli")
        assert refused.returncode == 125 and "store.in_use" in refused.stderr, refused
        bad = await asyncio.to_thread(_cli, lc, "create", "--volume", "cli")
        assert bad.returncode != 0 and "NAME:/PATH" in bad.stderr
        # rm waits until the sandbox is gone, and its volumes are released before that
        assert (await asyncio.to_thread(_cli, lc, "rm", "clibox")).returncode == 0
        gone = await asyncio.to_thread(_cli, lc, "volume", "rm", "cli")
        assert gone.returncode == 0, gone.stderr
    finally:
        leftovers = LocalVolumes(tmp_path / "jails")
        for vol in (tmp_path / "jails" / ".volumes" / "default").glob("*"):
            leftovers.remove("default", vol.name)
