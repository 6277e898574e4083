"""Extract one member of a client's tar with Python's ``data`` filter, on every Python 3.11.

Why: a ``copy`` step unpacks the client's tar into a layer (``commit.unpack_tar``), and the
``data`` extraction filter (PEP 706) is what keeps a hostile tar from writing outside the
layer. It arrived in Python 3.11.4; Debian 12's ``python3.11`` is 3.11.2, and that is the
interpreter of the images ``makeimages --python-home host`` builds (the builder Pod runs the
lifecycle image): there ``extract(..., filter="data")`` is a ``TypeError`` and every ``copy``
step of a Kubernetes build failed (found on the real node, tests/node/test_real_builds.py).

Flow: :func:`extract_member` uses ``filter="data"`` where Python has it; else
:func:`data_filter` applies the same rules here and the member is extracted as filtered:

- leading slashes stripped; a path that resolves outside the destination is refused;
- symbolic links to an absolute path or outside the destination, and hard links outside it,
  are refused; device nodes and FIFOs are refused;
- setuid, setgid and sticky bits and group/other write bits are cleared; a regular file is
  at least owner-readable and -writable.
"""

from __future__ import annotations

import copy
import os
import tarfile
from pathlib import Path

__all__ = ["data_filter", "extract_member"]

HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


def _inside(path: str, dest: str, member: tarfile.TarInfo, what: str) -> None:
    real = os.path.realpath(path)
    if os.path.commonpath([real, dest]) != dest:
        raise tarfile.TarError(f"{member.name!r}: {what} {real!r} is outside the destination")


def data_filter(member: tarfile.TarInfo, dest: Path) -> tarfile.TarInfo:
    """``member`` as the ``data`` filter lets it through (a copy), for Pythons without it.

    Raises:
        tarfile.TarError: the member is refused (the message says why).
    """
    root = os.path.realpath(dest)
    name = member.name.lstrip("/" + os.sep)
    if os.path.isabs(name):
        raise tarfile.TarError(f"{member.name!r}: an absolute path")
    target = os.path.join(root, name)
    _inside(target, root, member, "its path")
    if member.ischr() or member.isblk() or member.isfifo():
        raise tarfile.TarError(f"{member.name!r}: a device node or FIFO")
    if member.issym():
        if os.path.isabs(member.linkname):
            raise tarfile.TarError(f"{member.name!r}: a link to an absolute path")
        _inside(os.path.join(os.path.dirname(target), member.linkname), root, member, "its link")
    elif member.islnk():
        _inside(os.path.join(root, member.linkname), root, member, "its link")
    out = copy.copy(member)
    out.name = name
    mode = member.mode & 0o755  # no setuid/setgid/sticky, no group/other write
    if member.isreg() or member.islnk():
        mode |= 0o600
    out.mode = mode
    return out


def extract_member(archive: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    """Extract ``member`` into ``dest`` through the ``data`` filter (see the module docstring).

    Raises:
        tarfile.TarError: a refused or corrupt entry.
    """
    if HAS_DATA_FILTER:
        archive.extract(member, dest, filter="data")
    else:  # Python < 3.11.4: the same rules, applied here
        archive.extract(data_filter(member, dest), dest)
