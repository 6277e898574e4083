"""A local sandbox's disk quota: its own size-limited ext4 filesystem, loop-mounted.

Everything a sandbox can write to disk lives in one filesystem of exactly ``resources.disk``
bytes: the overlay's writable layer (``upper`` and its ``work``), ``/workspace`` and ``/tmp``
(an opaque directory of the writable layer, so the base's ``/tmp`` never shows through).
Filling it gives ``ENOSPC`` inside that sandbox and nowhere else, and ``statfs`` of any of
those paths (``df`` inside, ``sbx.metrics()`` from execd) reports the sandbox's own size and
usage, not the host's. ``/dev/shm`` is a tmpfs and counts against the memory limit.

Why this mechanism (the issue's options):

- *Project quotas on one shared filesystem* (ext4 ``-O quota,project`` or XFS ``prjquota``)
  would be cheapest per create, but they need the kernel's quota formats: this kernel family
  is built without ``CONFIG_QFMT_V2`` (ext4 refuses to mount a quota-enabled image) and without
  ``CONFIG_XFS_QUOTA``, so a design that needs them would leave every such host unlimited.
  btrfs qgroups fail with ``EDQUOT`` (not ``ENOSPC``) and do not show in ``statfs``.
- *A tmpfs* is memory, not disk.
- So: **one loop-mounted ext4 image per sandbox** (needs only ext4 and loop devices, true on
  any root host). ``mkfs`` is paid once per installation and size: a template image is made
  with ``mkfs.ext4`` the first time a size is used (``<state_dir>/.disk/ext4-<bytes>.img``,
  no journal: a sandbox does not outlive its holder, so there is nothing to recover after a
  crash), and each sandbox gets a sparse copy of it (a few hundred KiB of metadata), attached
  to a free loop device with ``LOOP_CONFIGURE`` (auto-clear) and mounted with ``mount(2)``
  directly (no ``losetup``/``mount`` processes): a few milliseconds plus the kernel's mount.
  ``noinit_itable`` keeps the kernel from zeroing inode tables in the background (ext4's
  group checksums make that safe), ``nobarrier`` keeps fsyncs inside (overlayfs copy-ups)
  from turning into flushes of the host's disk (nothing of a sandbox's disk outlives a host
  crash: its instance is gone and the driver destroys the leftovers), ``discard`` punches
  freed blocks out of the sparse image.
  Destroy detaches the mount (``MNT_DETACH``: never blocks on the sandbox's namespaces) and the
  loop device frees itself when the last reference goes.

The host's disk: images are sparse (thin provisioning: the sum of quotas may exceed the host's
free space, as with Kubernetes' ephemeral-storage limits). ``create`` refuses when the state
dir's filesystem has less than ``reserve_bytes`` free, so no sandbox starts on a nearly full
host; with ``preallocate`` each image is ``fallocate``\\d to its full size at create (no
``discard``) and create needs its whole disk plus the reserve, so sandboxes can never take
more of the host than was reserved for them, at the price of reserving every quota up front.

Without root, loop devices or ``mkfs.ext4`` there is no quota: :func:`probe` says why, and the
driver reports the ``disk_quota`` protection with that reason (``/tmp`` is then a tmpfs
charged to memory, as before), never a silent unlimited disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import os
import shutil
import struct
import subprocess
from pathlib import Path

from sandpod_lifecycle.runtime.base import ACTIVE

__all__ = [
    "DiskOptions",
    "DiskQuotaError",
    "attach",
    "detach",
    "mark_opaque",
    "mount_image",
    "probe",
]

MiB = 1024 * 1024
GiB = 1024 * MiB
MOUNT = "disk"  # <sandbox dir>/disk: the mount point; <sandbox dir>/disk.img: its image
IMAGE = "disk.img"
TEMPLATES = ".disk"  # <state_dir>/.disk/ext4-<bytes>.img
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MKFS_TIMEOUT = 60.0
ATTACH_TRIES = 16  # a free loop device can be taken by another process before we configure it

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID, MS_NODEV, MS_NOATIME = 2, 4, 1024
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8
_LOOP_INFO64 = struct.Struct("=5Q4I64s64s32s2Q")  # struct loop_info64 (232 bytes)
_libc = ctypes.CDLL(None, use_errno=True)


class DiskQuotaError(OSError):
    """The sandbox's filesystem could not be made (no room on the host, mkfs or mount failed)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DiskOptions:
    """How sandbox filesystems are provisioned (see the module docstring).

    Attributes:
        preallocate: ``fallocate`` each image to its full size (no thin provisioning).
        reserve_bytes: free space the host must have for a new sandbox to start (beyond its
            whole disk, with ``preallocate``).
    """

    preallocate: bool = False
    reserve_bytes: int = 2 * GiB


def probe() -> str:
    """``"active"`` if this host can give sandboxes a disk quota, else why not."""
    if os.geteuid() != 0:
        return "unavailable: rootless (loop devices need root): disk usage is not limited"
    if not os.path.exists("/dev/loop-control"):
        return "unavailable: no /dev/loop-control (modprobe loop): disk usage is not limited"
    if shutil.which("mkfs.ext4", path=TOOL_PATH) is None:
        return "unavailable: no mkfs.ext4 (install e2fsprogs): disk usage is not limited"
    try:
        filesystems = Path("/proc/filesystems").read_text().split()
    except OSError:
        filesystems = []
    if "ext4" not in filesystems:
        return "unavailable: the kernel has no ext4 (modprobe ext4): disk usage is not limited"
    return ACTIVE


def attach(
    state_dir: Path, sandbox_dir: Path, size: int, options: DiskOptions, *, durable: bool = False
) -> Path:
    """Give ``sandbox_dir`` a filesystem of ``size`` bytes mounted at ``sandbox_dir/disk``
    (host mount namespace) and return the mount point. Safe to undo with :func:`detach` at any
    point of a failure. ``durable``: a filesystem that outlives its sandboxes (a volume): with a
    journal and write barriers, so a host crash leaves it consistent.

    Raises:
        DiskQuotaError: the host is short of space, or the image could not be made or mounted.
    """
    _check_room(state_dir, size, options)
    template = _template(state_dir, size, durable)
    image, mount_point = sandbox_dir / IMAGE, sandbox_dir / MOUNT
    _copy_sparse(template, image, size, options.preallocate)
    mount_image(image, mount_point, options, durable=durable)
    return mount_point


def mount_image(
    image: Path, mount_point: Path, options: DiskOptions, *, durable: bool = False
) -> None:
    """Mount the ext4 ``image`` at ``mount_point`` (made if missing) through a loop device.

    Raises:
        DiskQuotaError: no loop device, or the mount failed.
    """
    mount_point.mkdir(mode=0o755, exist_ok=True)
    fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        device = _loop_attach(fd)
    finally:
        os.close(fd)  # the loop device holds the file now
    try:
        flags = MS_NOSUID | MS_NODEV | MS_NOATIME
        data = "noinit_itable" + ("" if durable else ",nobarrier")
        data += "" if options.preallocate else ",discard"
        if (
            _libc.mount(
                f"/dev/loop{device[0]}".encode(),
                str(mount_point).encode(),
                b"ext4",
                flags,
                data.encode(),
            )
            != 0
        ):
            err = ctypes.get_errno()
            raise DiskQuotaError(err, f"cannot mount the disk: {os.strerror(err)}")
    finally:
        os.close(device[1])  # auto-clear: the device frees itself once unmounted and closed


def detach(sandbox_dir: Path) -> None:
    """Unmount the sandbox's filesystem if it is mounted (lazily: the sandbox's own mount
    namespace may still be going away). Idempotent."""
    mount_point = sandbox_dir / MOUNT
    if not os.path.ismount(mount_point):
        return
    if _libc.umount2(str(mount_point).encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise DiskQuotaError(err, f"cannot unmount {mount_point}: {os.strerror(err)}")


def _check_room(state_dir: Path, size: int, options: DiskOptions) -> None:
    vfs = os.statvfs(state_dir)
    free = vfs.f_bavail * vfs.f_frsize
    needed = options.reserve_bytes + (size if options.preallocate else 0)
    if free < needed:
        what = f"its {size // MiB} MiB disk plus " if options.preallocate else ""
        raise DiskQuotaError(
            errno.ENOSPC,
            f"the host has {free // MiB} MiB free in {state_dir}: a new sandbox needs "
            f"{what}the reserve of {options.reserve_bytes // MiB} MiB "
            "(SANDPOD_DISK_RESERVE); free space on the host or ask for a smaller resources.disk",
        )


def _template(state_dir: Path, size: int, journal: bool = False) -> Path:
    """The mkfs'd template image for ``size``, made once (under a lock shared by every driver
    process of this state dir)."""
    templates = state_dir / TEMPLATES
    templates.mkdir(mode=0o700, exist_ok=True)
    path = templates / f"ext4{'j' if journal else ''}-{size}.img"
    if path.exists():
        return path
    with (templates / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        mkfs = shutil.which("mkfs.ext4", path=TOOL_PATH)
        if mkfs is None:
            raise DiskQuotaError(errno.ENOENT, "no mkfs.ext4 on this host (install e2fsprogs)")
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.truncate(size)
        # -i 16384: one inode per 16 KiB (the sandbox's inode quota too); no journal, no
        # reserved blocks (the sandbox gets all of it), no room kept for online growth, lazy
        # init: a few hundred KiB of metadata written, whatever the size.
        argv = [
            mkfs,
            "-q",
            "-F",
            "-m",
            "0",
            "-i",
            "16384",
            "-O",
            "has_journal,^resize_inode" if journal else "^has_journal,^resize_inode",
            "-E",
            "lazy_itable_init=1,nodiscard",
            "-L",
            "sandpod",
            str(tmp),
        ]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=MKFS_TIMEOUT, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            tmp.unlink(missing_ok=True)
            raise DiskQuotaError(errno.EIO, f"mkfs.ext4 failed: {exc}") from exc
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise DiskQuotaError(
                errno.EIO, f"mkfs.ext4 of a {size}-byte disk failed: {done.stderr.strip()}"
            )
        tmp.replace(path)
    return path


def _copy_sparse(src: Path, dst: Path, size: int, preallocate: bool) -> None:
    """Copy ``src``'s data extents into a new ``dst`` of ``size`` bytes, keeping holes."""
    with src.open("rb") as s, dst.open("xb") as d:
        sfd, dfd = s.fileno(), d.fileno()
        if preallocate:
            try:
                os.posix_fallocate(dfd, 0, size)
            except OSError as exc:
                why = f"cannot reserve {size} bytes on the host for the disk: {exc}"
                raise DiskQuotaError(exc.errno or errno.EIO, why) from exc
        else:
            os.ftruncate(dfd, size)
        offset = 0
        while offset < size:
            try:
                start = os.lseek(sfd, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after offset
                    break
                raise
            end = os.lseek(sfd, start, os.SEEK_HOLE)
            pos = start
            while pos < end:
                n = os.copy_file_range(sfd, dfd, end - pos, pos, pos)
                if n == 0:
                    break
                pos += n
            offset = end


def _loop_attach(image_fd: int) -> tuple[int, int]:
    """Bind ``image_fd`` to a free loop device (auto-clear); return (its number, an open fd)."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(ATTACH_TRIES):
            number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
            try:
                dev = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # the device node is not there yet (udev): ask again
            info = _LOOP_INFO64.pack(
                0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0
            )
            config = struct.pack("=II", image_fd, 0) + info + bytes(64)
            try:
                fcntl.ioctl(dev, LOOP_CONFIGURE, config)
            except OSError as exc:
                os.close(dev)
                if exc.errno == errno.EBUSY:
                    continue  # another process configured it first
                why = f"cannot attach a loop device: {exc}"
                raise DiskQuotaError(exc.errno or errno.EIO, why) from exc
            return number, dev
    finally:
        os.close(ctl)
    raise DiskQuotaError(errno.EBUSY, "no free loop device after several tries")


def mark_opaque(directory: Path) -> None:
    """Make ``directory`` (in an overlay's upper layer) opaque: the lower layer's entries of the
    same path never show through (the base's /tmp, when the base is the host's root)."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir()
    directory.chmod(0o1777)
    os.setxattr(directory, "trusted.overlay.opaque", b"y")
