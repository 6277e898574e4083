"""Client paths to paths in the sandbox's root and back, and ``OSError`` to typed ``fs.*`` errors
(the one place).

A resolved path is an absolute path *inside the sandbox's root* (:class:`~.rooted.Root`), never
checked here and then re-resolved: the operations resolve it through the root's descriptor.

- Jailed sandbox (local runtime): the root is the sandbox's own ``/``. ``/workspace`` (and
  below) and relative paths name the workspace; any other absolute path names that path in the
  sandbox (``/etc/hosts`` is the sandbox's ``/etc/hosts``); symlinks and ``..`` resolve inside.
- ``process`` runtime: the sandbox has no root of its own. ``/workspace`` and relative paths map
  into the sandbox's workspace directory, with the same rule as ``SandboxContext.resolve_cwd``;
  other absolute paths are host paths, used as given.

In both, a ``..`` that climbs lexically out of ``/workspace`` is refused: in the process runtime
it would land in the workspace's parent on the host, and one rule for both keeps clients
portable (name ``/etc/passwd`` directly instead). Replies show paths inside the workspace as
``/workspace/...`` whichever form the client used.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from sandpod_contract.errors import (
    FsAlreadyExists,
    FsError,
    FsInvalidPath,
    FsIsADirectory,
    FsNoSpace,
    FsNotADirectory,
    FsNotEmpty,
    FsNotFound,
    FsPermissionDenied,
    FsTooLarge,
)
from sandpod_execd.files.rooted import Root, host_root

__all__ = [
    "PATH_MAX",
    "WORKSPACE_ALIAS",
    "FileTooLarge",
    "Paths",
    "guard",
    "host_root",
    "os_error",
    "wire_str",
]

WORKSPACE_ALIAS = "/workspace"
PATH_MAX = 4096  # Linux PATH_MAX, in bytes: longer paths cannot be opened in one go

# errno -> the typed error a client branches on; everything else is the family base fs.error.
_BY_ERRNO: dict[int, type[FsError]] = {
    errno.ENOENT: FsNotFound,
    errno.EEXIST: FsAlreadyExists,
    errno.EISDIR: FsIsADirectory,
    errno.ENOTDIR: FsNotADirectory,
    errno.EACCES: FsPermissionDenied,
    errno.EPERM: FsPermissionDenied,
    errno.EROFS: FsPermissionDenied,
    errno.ETXTBSY: FsPermissionDenied,
    errno.ENAMETOOLONG: FsInvalidPath,
    errno.ELOOP: FsInvalidPath,
    errno.EINVAL: FsInvalidPath,  # e.g. moving a directory into itself
    errno.EXDEV: FsInvalidPath,  # a hard link across filesystems
    errno.ENOTEMPTY: FsNotEmpty,
    errno.ENOSPC: FsNoSpace,
    errno.EDQUOT: FsNoSpace,
    errno.EFBIG: FsTooLarge,
}


def wire_str(text: str) -> str:
    """``text`` as valid UTF-8 for the wire: undecodable bytes of a file name (kept by Python as
    surrogates) become U+FFFD. Such a name is shown, but cannot be addressed exactly."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(text).decode("utf-8", "replace")
    return text


class Paths:
    """Path rules of one sandbox (see the module docstring).

    ``root``: where paths resolve (a jailed sandbox's own root; by default the host's ``/``).
    ``new_owner`` (the jail's user) owns what fs creates there.
    """

    def __init__(
        self,
        workspace: Path | str,
        *,
        root: Root | None = None,
        new_owner: tuple[int, int] | None = None,
    ) -> None:
        self.root = root if root is not None else host_root()
        self.workspace = WORKSPACE_ALIAS if self.root.jailed else os.path.abspath(workspace)
        self.new_owner = new_owner

    def resolve(self, path: str) -> str:
        """The path in the root for a client ``path``.

        Raises:
            FsInvalidPath: empty, NUL byte, longer than PATH_MAX, or ``..`` leaving /workspace.
        """
        if not path:
            raise FsInvalidPath("path is empty", path="")
        if "\x00" in path:
            raise FsInvalidPath("path contains a NUL byte", path=path.replace("\x00", "\\0"))
        if len(path.encode("utf-8")) > PATH_MAX:
            raise FsInvalidPath(
                f"path is longer than {PATH_MAX} bytes", length=len(path.encode()), limit=PATH_MAX
            )
        aliased = path == WORKSPACE_ALIAS or path.startswith(WORKSPACE_ALIAS + "/")
        if not aliased and os.path.isabs(path):
            return path
        inside = path[len(WORKSPACE_ALIAS) :] if aliased else path
        inside = os.path.normpath(inside.lstrip("/")) if inside.strip("/") else "."
        if inside == ".." or inside.startswith("../"):
            raise FsInvalidPath(f"{path}: '..' climbs out of {WORKSPACE_ALIAS}", path=path)
        return self.workspace if inside == "." else os.path.join(self.workspace, inside)

    def display(self, host: str) -> str:
        """How a reply shows path ``host``: ``/workspace/...`` inside the workspace."""
        if host == self.workspace:
            return WORKSPACE_ALIAS
        if host.startswith(self.workspace + "/"):
            host = WORKSPACE_ALIAS + host[len(self.workspace) :]
        return wire_str(host)

    def is_protected(self, path: str) -> bool:
        """Paths ``fs.remove`` and ``fs.move`` refuse: the root and the workspace itself (links
        to them followed, in the root). Blocking."""
        try:
            st = self.root.stat(path.rstrip("/") or "/")
        except OSError:
            return False  # missing or unreachable: the operation itself reports it
        for top in ("/", self.workspace):
            with contextlib.suppress(OSError):
                other = self.root.stat(top)
                if (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino):
                    return True
        return False


class FileTooLarge(OSError):
    """EFBIG raised by our own size limits, carrying the numbers for ``fs.too_large``."""

    def __init__(self, path: str, size: int, limit: int, hint: str) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes exceed the limit of {limit}; {hint}", path)
        self.size = size
        self.limit = limit


def os_error(exc: OSError, paths: Paths | None = None, path: str | None = None) -> FsError:
    """The typed error for ``exc``, naming the path (in the root) ``exc`` names (else ``path``)."""
    cls = _BY_ERRNO.get(exc.errno or 0, FsError)
    host = exc.filename if isinstance(exc.filename, str) else path
    shown = None
    if isinstance(host, str):
        shown = paths.display(host) if paths else wire_str(host)
    if isinstance(exc, FileTooLarge):
        return FsTooLarge(f"{shown}: {exc.strerror}", path=shown, size=exc.size, limit=exc.limit)
    other = exc.filename2 if isinstance(exc.filename2, str) else None
    if other is not None and paths is not None:
        other = paths.display(other)
    name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
    reason = exc.strerror or name
    message = f"{shown}: {reason}" if shown else reason
    if other:
        message = f"{shown} -> {other}: {reason}"
    return cls(message, path=shown, other=other, errno=name)


@contextlib.contextmanager
def guard(paths: Paths | None = None, path: str | None = None) -> Iterator[None]:
    """Turn any ``OSError`` raised inside into its typed ``fs.*`` error (chained)."""
    try:
        yield
    except OSError as exc:
        raise os_error(exc, paths, path) from exc
