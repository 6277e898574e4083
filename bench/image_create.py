"""Create -> first exec from a cached image, next to host-root and default-base creates in the run.

The image is realistic: the default Debian base (``SANDPOD_DEFAULT_ROOTFS``, else the machine's
cached one, see ``_platform.default_rootfs``) split into three layers -- everything but ``/usr``,
``/usr`` but ``/usr/share``, ``/usr/share`` -- (hard-linked trees, so splitting copies nothing),
each packed by ``sandpod_image.layers.pack_layer`` into an OCI image layout
(``sandpod_image.ocilayout``) in a temp dir. A lifecycle (local runtime) serves a template with
``image: oci:<layout>:bench``; one create of it pulls the image into the node's store before
anything is timed (that first create is printed on its own, it is not a sample). Then ``--count``
creates of each template -- image, ``rootfs: /`` (the host root: the floor), default base --
alternate in turn so a noisy moment hits all alike. Target (issue 14): image p50 within 1.1x
of the host root's.

Disk: ``--keep`` image sandboxes are held at once; the blocks each adds under the jails directory
(its writable layer, workspace, disk image if quotas are on) are printed next to the image's
size on the node (its unpacked layers), and the store is measured before and after: its layers
are shared, never copied per sandbox.

    .venv/bin/python bench/image_create.py [--count 20] [--keep 5] [--compress gzip]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _platform import default_rootfs, lifecycle, pct, summary
from sandbox_create import allocated, apply_template, create_one, create_samples
from sandpod import AsyncSandbox
from sandpod_image.ocilayout import ImageConfig, OciLayout

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed.
# Uncompressed layers: packing 500 MB with gzip would be most of a smoke run.
SMOKE_ARGS = ["--count", "2", "--keep", "2", "--compress", "none"]

TAG = "bench"
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _link_tree(src: Path, dest: Path) -> None:
    """``dest`` a copy of ``src`` whose files are hard links (a plain copy across filesystems)."""
    same_fs = src.stat().st_dev == dest.parent.stat().st_dev
    subprocess.run(["cp", "-al" if same_fs else "-a", str(src), str(dest)], check=True)


def split_layers(fs: Path, work: Path) -> list[Path]:
    """The base tree ``fs`` as three layer directories under ``work``, bottom first."""
    bottom, usr, share = work / "l0", work / "l1", work / "l2"
    _link_tree(fs, bottom)
    shutil.rmtree(bottom / "usr")
    usr.mkdir()
    _link_tree(fs / "usr", usr / "usr")
    shutil.rmtree(usr / "usr" / "share")
    share.mkdir()
    (share / "usr").mkdir()
    shutil.copystat(fs / "usr", share / "usr")
    _link_tree(fs / "usr" / "share", share / "usr" / "share")
    return [bottom, usr, share]


def build_image(fs: Path, work: Path, compress: str) -> tuple[str, int]:
    """Pack ``fs`` as a three-layer image into an OCI layout; (reference, blob bytes)."""
    layout = OciLayout(work / "layout")
    blobs = 0
    for i, layer in enumerate(split_layers(fs, work)):
        packed = layout.add_layer(layer, created_by=f"bench layer {i}", compress=compress, mtime=0)
        blobs += packed.size
        shutil.rmtree(layer)
    layout.write_image(ImageConfig(env=(PATH,), cmd=("/bin/bash",)), ref=TAG)
    return f"oci:{layout.root}:{TAG}", blobs


async def disk_of_image(url: str, state: Path, template: str, keep: int) -> dict[str, float]:
    """Bytes each of ``keep`` live image sandboxes adds under the jails directory, and the
    node's image store (unpacked layers, blobs) before and while they live: unchanged, since
    every sandbox stacks the same layer directories."""
    jails, layers, blobs = state / "jails", state / "images" / "layers", state / "images" / "blobs"
    before = allocated(jails), allocated(layers)
    held = [await AsyncSandbox.create(nats_url=url, template=template) for _ in range(keep)]
    try:
        for sbx in held:
            r = await sbx.exec(["true"])
            if r.exit_code != 0:
                raise RuntimeError(f"exec in an image sandbox failed: {r.stderr}")
        during = allocated(jails), allocated(layers)
        dirs = len(list(layers.glob("sha256/*/fs")))
    finally:
        for sbx in held:
            async with sbx:
                await sbx.kill()
    return {
        "per_sandbox": (during[0] - before[0]) / keep,
        "layers_before": before[1],
        "layers_during": during[1],
        "blobs": allocated(blobs),
        "layer_dirs": dirs,
        "keep": keep,
    }


async def main(count: int, keep: int, compress: str) -> None:
    fs = default_rootfs()
    with tempfile.TemporaryDirectory(prefix="image-create-bench-") as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        ref, blobs = await asyncio.to_thread(build_image, fs, tmp / "image", compress)
        print(
            f"image: {fs} as 3 layers ({compress}), {blobs / 1e6:.0f} MB of blobs, "
            f"packed in {time.perf_counter() - t0:.1f} s"
        )
        state = tmp / "state"
        state.mkdir()
        async with lifecycle(state, "local", SANDPOD_DEFAULT_ROOTFS=str(fs)) as url:
            image = await apply_template(url, "image", {"image": ref})
            host = await apply_template(url, "hostroot", {"rootfs": "/"})
            pull = await create_one(url, image)  # pulls into the node's store: not a sample
            await create_one(url, host)
            await create_one(url, None)
            created = await create_samples(url, count, [image, host, None])
            disk = await disk_of_image(url, state, image, keep) if keep else None
    report(count, pull, created, disk)


def report(
    count: int, pull: float, created: list[list[float]], disk: dict[str, float] | None
) -> None:
    print(f"create -> first exec, {count} of each template in turn (local runtime)\n")
    print(f"first create of the image (pull + unpack into the node's store): {pull:.2f} s")
    image, host, default = created
    print(summary("floor: create + first exec (rootfs: /)", host))
    print(summary("create + first exec (cached image)", image))
    print(summary("create + first exec (default base)", default))
    for name, samples in (("image", image), ("default base", default)):
        for q in (50, 99):
            ratio = pct(samples, q) / pct(host, q)
            verdict = "" if q != 50 else ("  OK" if ratio <= 1.1 else "  ABOVE TARGET")
            target = "; target p50 <= 1.1x" if q == 50 else ""
            print(f"  -> {name} p{q} {ratio:.2f}x the host root's{target}{verdict}")
    if disk is not None:
        mb = 1e6
        print(
            f"disk per additional image sandbox: {disk['per_sandbox'] / mb:.2f} MB allocated "
            "under its jail (writable layer, workspace)"
        )
        print(
            f"the image's unpacked layers on the node: {disk['layers_before'] / mb:.0f} MB "
            f"before, {disk['layers_during'] / mb:.0f} MB with {disk['keep']:.0f} sandboxes live "
            f"({disk['layer_dirs']:.0f} layer dirs, shared); its blobs: {disk['blobs'] / mb:.0f} MB"
        )
        share = disk["per_sandbox"] / max(disk["layers_before"], 1)
        print(f"  -> per-sandbox disk {share:.4f}x the image's unpacked size")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--keep", type=int, default=5, help="live sandboxes for the disk figure")
    parser.add_argument("--compress", choices=["gzip", "zstd", "none"], default="gzip")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the local runtime needs root: run as root")
    asyncio.run(main(args.count, args.keep, args.compress))
