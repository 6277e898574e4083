"""The local runtime's SandboxVolumes: one quota'd filesystem per volume, outliving sandboxes.

Each volume is its own ext4 image of exactly ``spec.size`` bytes (``diskquota.py``'s mechanism,
with a journal and write barriers: it must survive a host crash), loop-mounted on the host, and
kept under the installation's state dir but outside every sandbox directory, so destroying a
sandbox never touches it:

    <state_dir>/.volumes/<namespace>/<name>/disk.img   the filesystem (sparse)
    <state_dir>/.volumes/<namespace>/<name>/disk/      its mount point (host mount namespace)
    <state_dir>/.volumes/<namespace>/<name>/owner      the uid:gid its files were handed to last

The lifecycle API makes it on ``volumes.create`` (:meth:`LocalVolumes.provision`) and removes it
on ``volumes.delete`` (:meth:`LocalVolumes.remove`: unmount, delete the image: the disk is
free); the driver bind-mounts ``disk/`` into a jail at the mount path (read-only binds for
readers), after :meth:`LocalVolumes.source` remounted it if the host rebooted. Writing is
ENOSPC at the size, in that volume only. The state dir is masked inside every sandbox, so no
sandbox sees another's volumes.

Ownership. Sandboxes have different uids (``uids.py``), so files a writer left belong to its
uid. When a sandbox mounts a volume read-write, :meth:`LocalVolumes.hand_over` chowns every
inode that belongs to the previous writer's uid (the ``owner`` file) to the new sandbox's, and
the root to it: the new writer owns its data as if it had written it, and nothing another uid
owns changes hands (there is none: a volume only ever has one writer at a time, and readers
cannot write). It walks the whole tree (cost linear in the files, paid once per change of
writer, not per mount) and never follows a symlink (``lchown``). A shared gid instead would
need every sandbox's umask to leave group write on, which the sandbox's code decides; an
idmapped mount would avoid the walk but needs util-linux >= 2.39 on every host. Readers run as
their own uid: they read what is world-readable (the usual 0644/0755), which is what read-only
sharing means here.

Without a disk quota on this host (rootless, no loop devices: ``diskquota.probe``) a volume is
a plain directory there, and :meth:`LocalVolumes.quota` says why it is unlimited.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from pathlib import Path

from sandpod_contract.volumes import SandboxVolumeSpec
from sandpod_lifecycle.runtime import diskquota
from sandpod_lifecycle.runtime.base import ACTIVE
from sandpod_lifecycle.runtime.diskquota import DiskOptions, DiskQuotaError

__all__ = ["VOLUMES", "LocalVolumeBackend", "LocalVolumes", "VolumeMissing"]

VOLUMES = ".volumes"
OWNER = "owner"
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class VolumeMissing(OSError):
    """The volume has no storage on this host (never provisioned here, or removed)."""


class LocalVolumes:
    """Provision, find, hand over and remove the volumes of one state dir (blocking calls: run
    them in a thread)."""

    def __init__(self, state_dir: Path, options: DiskOptions | None = None) -> None:
        self.state_dir = state_dir
        self.root = state_dir / VOLUMES
        self.options = options or DiskOptions()
        self._quota: str | None = None

    def quota(self) -> str:
        """``"active"`` when volumes are size-limited filesystems here, else why not."""
        if self._quota is None:
            self._quota = diskquota.probe()
        return self._quota

    def dir(self, namespace: str, name: str) -> Path:
        """The volume's directory. Raises ValueError for names that are not DNS labels."""
        for part in (namespace, name):
            if not _LABEL.fullmatch(part):
                raise ValueError(f"invalid volume namespace or name {part!r}")
        return self.root / namespace / name

    def provision(self, namespace: str, name: str, size: int) -> Path:
        """Make the volume's filesystem (idempotent: an existing one is only remounted); return
        the directory to bind. Raises DiskQuotaError (host full, mkfs or mount failed)."""
        d = self.dir(namespace, name)
        if (d / diskquota.IMAGE).exists() or (self.quota() != ACTIVE and d.is_dir()):
            return self.source(namespace, name)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.mkdir(mode=0o700, exist_ok=True)
        if self.quota() != ACTIVE:
            (d / diskquota.MOUNT).mkdir(mode=0o755, exist_ok=True)
            return d / diskquota.MOUNT
        try:
            mount = diskquota.attach(self.state_dir, d, size, self.options, durable=True)
        except BaseException:
            with contextlib.suppress(OSError):
                self._remove(d)
            raise
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(mount / "lost+found")  # ext4's: the volume starts empty
        return mount

    def source(self, namespace: str, name: str) -> Path:
        """The mounted directory of an existing volume (mounted again after a reboot).

        Raises:
            VolumeMissing: no storage for it here.
            DiskQuotaError: its image could not be mounted.
        """
        d = self.dir(namespace, name)
        mount = d / diskquota.MOUNT
        image = d / diskquota.IMAGE
        if image.exists():
            if not os.path.ismount(mount):
                diskquota.mount_image(image, mount, self.options, durable=True)
            return mount
        if self.quota() != ACTIVE and mount.is_dir():
            return mount
        raise VolumeMissing(2, f"volume {namespace}/{name} has no storage on this host")

    def hand_over(self, namespace: str, name: str, uid: int, gid: int) -> None:
        """Give the volume's files to ``uid:gid`` (its new writer): every inode the previous
        writer owned, and the root. Never follows symlinks. Raises VolumeMissing, OSError."""
        mount = self.source(namespace, name)
        owner = self.dir(namespace, name) / OWNER
        try:
            old_uid, old_gid = (int(x) for x in owner.read_text().split(":"))
        except (OSError, ValueError):
            old_uid, old_gid = 0, 0  # a new volume: only its root (root's) exists
        if (old_uid, old_gid) != (uid, gid):
            os.lchown(mount, uid, gid)
            for top, dirs, files in os.walk(mount):
                for entry in (*dirs, *files):
                    path = os.path.join(top, entry)
                    st = os.lstat(path)
                    if st.st_uid == old_uid or st.st_gid == old_gid:
                        os.lchown(
                            path,
                            uid if st.st_uid == old_uid else -1,
                            gid if st.st_gid == old_gid else -1,
                        )
        tmp = owner.with_suffix(".tmp")
        tmp.write_text(f"{uid}:{gid}")
        tmp.replace(owner)

    def usage(self, namespace: str, name: str) -> int | None:
        """Bytes in use on the volume's filesystem (None: not mounted here)."""
        mount = self.dir(namespace, name) / diskquota.MOUNT
        if not os.path.ismount(mount):
            return None
        vfs = os.statvfs(mount)
        return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize

    def remove(self, namespace: str, name: str) -> None:
        """Unmount and delete the volume's storage (idempotent). Raises DiskQuotaError."""
        self._remove(self.dir(namespace, name))

    def _remove(self, d: Path) -> None:
        diskquota.detach(d)  # lazily: a jail being torn down may still hold a bind of it
        if os.path.ismount(d / diskquota.MOUNT):
            raise DiskQuotaError(16, f"{d / diskquota.MOUNT} is still mounted")
        shutil.rmtree(d, ignore_errors=True)


class LocalVolumeBackend:
    """The lifecycle API's ``VolumeBackend`` on the local runtime (blocking work in threads)."""

    def __init__(self, volumes: LocalVolumes) -> None:
        self.volumes = volumes

    async def provision(self, namespace: str, name: str, spec: SandboxVolumeSpec) -> None:
        await asyncio.to_thread(self.volumes.provision, namespace, name, spec.size_bytes)

    async def remove(self, namespace: str, name: str) -> None:
        await asyncio.to_thread(self.volumes.remove, namespace, name)

    async def usage(self, namespace: str, name: str) -> int | None:
        return await asyncio.to_thread(self.volumes.usage, namespace, name)
