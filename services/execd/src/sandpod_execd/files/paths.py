"""Client paths to host paths and back, and ``OSError`` to typed ``fs.*`` errors (the one place).

In the ``process`` runtime a sandbox has no root of its own: ``/workspace`` (and everything below
it) and relative paths map into the sandbox's workspace directory, with the same rule as
``SandboxContext.resolve_cwd``; other absolute paths are host paths, used as given (the kernel
resolves their ``..`` and symlinks). A ``..`` that climbs out of ``/workspace`` is refused:
in an isolated runtime it would land in the sandbox's ``/``, here in the workspace's parent on the
host, and no answer is right for both. Replies show paths inside the workspace as
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

__all__ = [
    "PATH_MAX",
    "WORKSPACE_ALIAS",
    "FileTooLarge",
    "Paths",
    "guard",
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

    ``confined`` (a jailed sandbox, local runtime): execd works on the host as root, so only the
    workspace is reachable, and a path whose symlinks lead out of it is refused. This is an
    interim guard, checked before the operation (a sandbox process racing to swap a directory
    for a link could still win): the real fix is resolving inside the jail (``openat2`` with
    ``RESOLVE_IN_ROOT``, or a helper in its namespaces). ``new_owner`` (the jail's user) owns
    what fs creates there.
    """

    def __init__(
        self,
        workspace: Path | str,
        *,
        confined: bool = False,
        new_owner: tuple[int, int] | None = None,
    ) -> None:
        self.workspace = os.path.abspath(workspace)
        self.confined = confined
        self.new_owner = new_owner

    def resolve(self, path: str) -> str:
        """The host path for a client ``path``.

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
            if self.confined:
                raise FsInvalidPath(
                    f"{path}: only {WORKSPACE_ALIAS} is reachable through fs in this runtime",
                    path=path,
                )
            return path
        inside = path[len(WORKSPACE_ALIAS) :] if aliased else path
        inside = os.path.normpath(inside.lstrip("/")) if inside.strip("/") else "."
        if inside == ".." or inside.startswith("../"):
            raise FsInvalidPath(f"{path}: '..' climbs out of {WORKSPACE_ALIAS}", path=path)
        host = self.workspace if inside == "." else os.path.join(self.workspace, inside)
        if self.confined:
            real, top = os.path.realpath(host), os.path.realpath(self.workspace)
            if real != top and not real.startswith(top + "/"):
                raise FsInvalidPath(f"{path}: a symlink leads out of {WORKSPACE_ALIAS}", path=path)
        return host

    def display(self, host: str) -> str:
        """How a reply shows host path ``host``: ``/workspace/...`` inside the workspace."""
        if host == self.workspace:
            return WORKSPACE_ALIAS
        if host.startswith(self.workspace + "/"):
            host = WORKSPACE_ALIAS + host[len(self.workspace) :]
        return wire_str(host)

    def is_protected(self, host: str) -> bool:
        """Paths ``fs.remove`` refuses: ``/`` and the workspace itself."""
        real = os.path.realpath(host)
        return real in ("/", os.path.realpath(self.workspace))


class FileTooLarge(OSError):
    """EFBIG raised by our own size limits, carrying the numbers for ``fs.too_large``."""

    def __init__(self, path: str, size: int, limit: int, hint: str) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes exceed the limit of {limit}; {hint}", path)
        self.size = size
        self.limit = limit


def os_error(exc: OSError, paths: Paths | None = None, path: str | None = None) -> FsError:
    """The typed error for ``exc``, naming the host path ``exc`` names (else ``path``)."""
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
