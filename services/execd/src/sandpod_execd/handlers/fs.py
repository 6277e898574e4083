"""``fs``-family handlers (see ``sandpod_contract.messages.fs`` and ``schemas/docs/fs.md``).

Each handler resolves the client's path (``files.paths``), runs the blocking work, with the
sandbox user's filesystem identity (``files.identity``: the API may do what that user may, no
more), on this family's own bounded thread pool (``FS_THREADS`` workers, so a slow disk or a big
tree walk never stalls the event loop that answers pings and acks), maps ``OSError`` to typed
``fs.*`` errors and builds the reply. Replies that list things (entries, matches, files) are cut
to fit one NATS message, and say ``truncated``. Uploads are the only state: a bounded table swept
by one supervised task while uploads exist.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sandpod_contract.codec import Message, encode
from sandpod_contract.errors import BadRequest, FsInvalidPath
from sandpod_contract.messages.fs import (
    FsChmod,
    FsChown,
    FsChunk,
    FsCopy,
    FsEntry,
    FsExistence,
    FsGlob,
    FsList,
    FsListing,
    FsMatch,
    FsMkdir,
    FsMove,
    FsOwner,
    FsPath,
    FsRead,
    FsRemove,
    FsRemoved,
    FsReplace,
    FsReplaced,
    FsReplaceResult,
    FsSearch,
    FsSearchResult,
    FsSkipped,
    FsUpload,
    FsUploadRef,
    FsUploadStatus,
    FsWrite,
    FsWriteChunk,
    FsWriteCommit,
    FsWriteOpen,
)
from sandpod_execd.files import listing, ops, search
from sandpod_execd.files.atomic import AtomicFile
from sandpod_execd.files.entries import Entry, entry_of, group_name, owner_ids, user_name
from sandpod_execd.files.listing import Budget
from sandpod_execd.files.paths import WORKSPACE_ALIAS, Paths, os_error, wire_str
from sandpod_execd.files.uploads import UploadTable
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.sandbox import SandboxContext

__all__ = ["FsHandlers"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)

FS_THREADS = 4  # concurrent reads, writes and stats; more requests queue for a worker
WALK_THREADS = 2  # concurrent tree walks (list, glob, search, replace, recursive changes)
MAX_UPLOADS = 64  # open uploads per execd (beyond: busy)
UPLOAD_CHUNK = 1024 * 1024  # largest chunk suggested to clients (capped by max_request_bytes)
READ_OVERHEAD = 1024  # room for an FsChunk's fields next to its data
REPLY_OVERHEAD = 8 * 1024  # room for a listing's own fields
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
LIST_SECONDS, SEARCH_SECONDS, REPLACE_SECONDS = 10.0, 20.0, 60.0


class FsHandlers:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._pool = ThreadPoolExecutor(max_workers=FS_THREADS, thread_name_prefix="sandpod-fs")
        # Walks get their own workers: a 20-second search must not hold up reads and writes.
        self._walks = ThreadPoolExecutor(max_workers=WALK_THREADS, thread_name_prefix="fs-walk")
        self._read_cap = max(deps.max_payload - READ_OVERHEAD, 4096)
        self._reply_budget = max(deps.max_payload - REPLY_OVERHEAD, 64 * 1024)
        self._chunk_size = min(UPLOAD_CHUNK, deps.settings.max_request_bytes - READ_OVERHEAD)
        self._uploads = UploadTable(
            self._blocking,
            lambda coro, name: deps.supervisor.spawn(coro, name=name),
            max_open=MAX_UPLOADS,
            idle_timeout=deps.settings.abandon_after,
        )
        # Per served context, not per id: a sandbox served again gets a new jail and root.
        self._paths: weakref.WeakKeyDictionary[SandboxContext, Paths] = weakref.WeakKeyDictionary()
        self._stop = threading.Event()  # tells walks on worker threads to end (shutdown)

    def routes(self) -> dict[tuple[str, str], Route]:
        verbs: dict[str, Callable[..., Any]] = {
            "read": self.read,
            "write": self.write,
            "write_open": self.write_open,
            "write_chunk": self.write_chunk,
            "write_commit": self.write_commit,
            "write_abort": self.write_abort,
            "stat": self.stat,
            "exists": self.exists,
            "list": self.list_dir,
            "glob": self.glob_paths,
            "search": self.search_text,
            "replace": self.replace,
            "mkdir": self.mkdir,
            "remove": self.remove,
            "move": self.move,
            "copy": self.copy,
            "chmod": self.chmod,
            "chown": self.chown,
        }
        return {("fs", verb): Route(handler) for verb, handler in verbs.items()}

    async def close(self) -> None:
        """Abort open uploads (removing their temporary files), make running walks end early,
        and retire the workers once the work already queued is done (requests in flight still
        get their replies within the service's grace period)."""
        self._stop.set()
        self._uploads.close()
        self._pool.shutdown(wait=False)
        self._walks.shutdown(wait=False)

    # -- plumbing ------------------------------------------------------------------------------

    def _for(self, sbx: SandboxContext) -> Paths:
        paths = self._paths.get(sbx)
        if paths is None:
            jail = sbx.jail
            paths = self._paths[sbx] = Paths(
                sbx.workspace,
                root=sbx.fs_root,
                new_owner=jail.owner if jail is not None else None,
            )
        return paths

    async def _blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def _run(
        self, paths: Paths, fn: Callable[[], T], path: str | None = None, *, walk: bool = False
    ) -> T:
        """Run ``fn`` on a worker (``walk``: the tree-walk pool) with the sandbox user's rights
        (``Root.acting``); an ``OSError`` becomes its typed ``fs.*`` error."""
        loop = asyncio.get_running_loop()

        def as_user() -> T:
            with paths.root.acting(keep=True):  # these workers only ever do sandboxes' fs work
                return fn()

        try:
            return await loop.run_in_executor(self._walks if walk else self._pool, as_user)
        except OSError as exc:
            raise os_error(exc, paths, path) from exc

    def _entry(self, paths: Paths, e: Entry) -> FsEntry:
        shown = paths.display(e.path)  # the workspace itself is named "workspace", not its dir
        return FsEntry(
            name=os.path.basename(shown.rstrip("/")) or "/",
            path=shown,
            type=e.type,
            size=e.size,
            mode=e.mode,
            permissions=e.permissions,
            uid=e.uid,
            gid=e.gid,
            owner=user_name(e.uid),
            group=group_name(e.gid),
            mtime=e.mtime,
            target=None if e.target is None else wire_str(e.target),
        )

    def _fit(self, items: Iterable[M]) -> tuple[list[M], bool]:
        """The leading ``items`` whose encoding fits one reply; True if some were cut."""
        out: list[M] = []
        used = 0
        for item in items:
            used += len(encode(item)) + 8
            if used > self._reply_budget:
                return out, True
            out.append(item)
        return out, False

    async def _stat_reply(self, paths: Paths, host: str, follow: bool = True) -> FsEntry:
        return await self._run(
            paths, lambda: self._entry(paths, entry_of(paths.root, host, follow=follow)), host
        )

    def _budget(self, seconds: float) -> Budget:
        return Budget(seconds=seconds, stop=self._stop)

    @staticmethod
    def _owner(owner: FsOwner | None) -> tuple[int, int] | None:
        """Blocking (name lookups): the ``(uid, gid)`` an owner names."""
        if owner is None:
            return None
        return owner_ids(owner.uid, owner.gid, owner.user, owner.group)

    @staticmethod
    def _check_pattern(pattern: str | None) -> None:
        if pattern is not None and ".." in pattern.split("/"):
            raise FsInvalidPath(f"glob {pattern!r}: '..' is not allowed in a pattern")

    # -- read and write ------------------------------------------------------------------------

    async def read(self, sbx: SandboxContext, req: FsRead) -> FsChunk:
        paths = self._for(sbx)
        host = paths.resolve(req.path)
        length = self._read_cap if req.length is None else min(req.length, self._read_cap)
        c = await self._run(
            paths, lambda: ops.read_chunk(paths.root, host, req.offset, length, req.max_size), host
        )
        return FsChunk(data=c.data, offset=c.offset, size=c.size, eof=c.eof, mtime=c.mtime)

    async def write(self, sbx: SandboxContext, req: FsWrite) -> FsEntry:
        paths = self._for(sbx)
        host = paths.resolve(req.path)

        def work() -> FsEntry:
            target = ops.write_file(
                paths.root,
                host,
                req.data,
                mode=req.mode,
                owner=self._owner(req.owner),
                make_parents=req.make_parents,
                exclusive=req.exclusive,
                new_owner=paths.new_owner,
            )
            return self._entry(paths, entry_of(paths.root, target))

        return await self._run(paths, work, host)

    async def write_open(self, sbx: SandboxContext, req: FsWriteOpen) -> FsUpload:
        paths = self._for(sbx)
        host = paths.resolve(req.path)

        def work() -> AtomicFile:
            return AtomicFile(
                paths.root,
                host,
                mode=req.mode,
                owner=self._owner(req.owner),
                make_parents=req.make_parents,
                exclusive=req.exclusive,
                new_owner=paths.new_owner,
            )

        file = await self._run(paths, work, host)
        upload = self._uploads.add(sbx.sandbox_id, file, paths.display(host))
        return FsUpload(
            upload_id=upload.id,
            chunk_size=self._chunk_size,
            idle_timeout=self._uploads.idle_timeout,
        )

    async def write_chunk(self, sbx: SandboxContext, req: FsWriteChunk) -> FsUploadStatus:
        try:
            received = await self._uploads.chunk(
                sbx.sandbox_id, req.upload_id, req.offset, req.data
            )
        except OSError as exc:  # the upload was aborted; its target is untouched
            raise os_error(exc, self._for(sbx)) from exc
        return FsUploadStatus(upload_id=req.upload_id, received=received)

    async def write_commit(self, sbx: SandboxContext, req: FsWriteCommit) -> FsEntry:
        paths = self._for(sbx)
        try:
            target = await self._uploads.commit(sbx.sandbox_id, req.upload_id, req.size, req.sha256)
        except OSError as exc:
            raise os_error(exc, paths) from exc
        return await self._stat_reply(paths, target, follow=False)

    async def write_abort(self, sbx: SandboxContext, req: FsUploadRef) -> FsUploadStatus:
        received = self._uploads.abort(sbx.sandbox_id, req.upload_id)
        return FsUploadStatus(upload_id=req.upload_id, received=received)

    # -- describe ------------------------------------------------------------------------------

    async def stat(self, sbx: SandboxContext, req: FsPath) -> FsEntry:
        paths = self._for(sbx)
        return await self._stat_reply(paths, paths.resolve(req.path), follow=req.follow)

    async def exists(self, sbx: SandboxContext, req: FsPath) -> FsExistence:
        paths = self._for(sbx)
        host = paths.resolve(req.path)
        kind = await self._run(paths, lambda: ops.exists(paths.root, host, req.follow), host)
        return FsExistence(path=paths.display(host), exists=kind is not None, type=kind)

    async def list_dir(self, sbx: SandboxContext, req: FsList) -> FsListing:
        paths = self._for(sbx)
        host = paths.resolve(req.path)
        limit = min(req.limit or DEFAULT_LIMIT, MAX_LIMIT)

        def work() -> FsListing:
            found = listing.list_dir(
                paths.root,
                host,
                depth=req.depth,
                hidden=req.hidden,
                limit=limit,
                cursor=req.cursor,
                budget=self._budget(LIST_SECONDS),
            )
            entries, cut = self._fit(self._entry(paths, e) for _, e in found.entries)
            cursor = found.entries[len(entries) - 1][0] if cut and entries else found.cursor
            return FsListing(
                path=paths.display(host),
                entries=tuple(entries),
                truncated=found.truncated or cut,
                cursor=cursor,
            )

        return await self._run(paths, work, host, walk=True)

    def _glob_root(self, paths: Paths, req: FsGlob) -> tuple[str, str]:
        """``(host root, relative pattern)``; an absolute pattern carries its own root."""
        prefix, pattern = listing.split_pattern(req.pattern)
        if prefix is None:
            return paths.resolve(WORKSPACE_ALIAS if req.path is None else req.path), pattern
        if req.path is not None:
            raise BadRequest("an absolute pattern carries its root: leave 'path' unset")
        return paths.resolve(prefix), pattern

    async def glob_paths(self, sbx: SandboxContext, req: FsGlob) -> FsListing:
        paths = self._for(sbx)
        root, pattern = self._glob_root(paths, req)
        self._check_pattern(pattern)
        limit = min(req.limit or DEFAULT_LIMIT, MAX_LIMIT)

        def work() -> FsListing:
            found = listing.glob(
                paths.root,
                root,
                pattern,
                hidden=req.hidden,
                kind=req.type,
                limit=limit,
                budget=self._budget(SEARCH_SECONDS),
            )
            entries, cut = self._fit(self._entry(paths, e) for _, e in found.entries)
            return FsListing(
                path=paths.display(root), entries=tuple(entries), truncated=found.truncated or cut
            )

        return await self._run(paths, work, root, walk=True)

    # -- search and replace --------------------------------------------------------------------

    async def search_text(self, sbx: SandboxContext, req: FsSearch) -> FsSearchResult:
        paths = self._for(sbx)
        root = paths.resolve(WORKSPACE_ALIAS if req.path is None else req.path)
        self._check_pattern(req.glob)
        limit = min(req.limit or DEFAULT_LIMIT, MAX_LIMIT)

        def work() -> FsSearchResult:
            found = search.search(
                paths.root,
                root,
                req.query,
                regex=req.regex,
                case_sensitive=req.case_sensitive,
                pattern=req.glob,
                hidden=req.hidden,
                binary=req.binary,
                limit=limit,
                budget=self._budget(SEARCH_SECONDS),
            )
            matches, cut = self._fit(
                FsMatch(
                    path=paths.display(m.path), line=m.line, column=m.column, text=wire_str(m.text)
                )
                for m in found.matches
            )
            return FsSearchResult(
                matches=tuple(matches),
                files_scanned=found.files_scanned,
                truncated=found.truncated or cut,
            )

        return await self._run(paths, work, root, walk=True)

    async def replace(self, sbx: SandboxContext, req: FsReplace) -> FsReplaceResult:
        paths = self._for(sbx)
        root = paths.resolve(req.path)
        self._check_pattern(req.glob)

        def work() -> FsReplaceResult:
            done = search.replace(
                paths.root,
                root,
                req.old,
                req.new,
                regex=req.regex,
                count=req.count,
                pattern=req.glob,
                hidden=req.hidden,
                binary=req.binary,
                dry_run=req.dry_run,
                budget=self._budget(REPLACE_SECONDS),
            )
            files = [FsReplaced(path=paths.display(p), count=n) for p, n in done.files]
            skipped = [FsSkipped(path=paths.display(p), reason=r) for p, r in done.skipped]
            files, cut = self._fit(files)
            skipped, cut_skipped = self._fit(skipped)
            return FsReplaceResult(
                files=tuple(files),
                total=done.total,
                skipped=tuple(skipped),
                truncated=done.truncated or cut or cut_skipped,
            )

        return await self._run(paths, work, root, walk=True)

    # -- change --------------------------------------------------------------------------------

    async def mkdir(self, sbx: SandboxContext, req: FsMkdir) -> FsEntry:
        paths = self._for(sbx)
        host = paths.resolve(req.path)

        def work() -> None:
            owner = self._owner(req.owner) or paths.new_owner
            ops.mkdir(paths.root, host, parents=req.parents, mode=req.mode, owner=owner)

        await self._run(paths, work, host)
        return await self._stat_reply(paths, host)

    def _refuse_protected(self, paths: Paths, host: str, what: str) -> None:
        """Blocking (stats): refuse to remove or move ``/`` or the workspace itself."""
        if paths.is_protected(host):
            raise FsInvalidPath(
                f"refusing to {what} {paths.display(host)}", path=paths.display(host)
            )

    async def remove(self, sbx: SandboxContext, req: FsRemove) -> FsRemoved:
        paths = self._for(sbx)
        host = paths.resolve(req.path)

        def work() -> bool:
            self._refuse_protected(paths, host, "remove")
            return ops.remove(paths.root, host, recursive=req.recursive, missing_ok=req.missing_ok)

        existed = await self._run(paths, work, host, walk=req.recursive)
        return FsRemoved(path=paths.display(host), existed=existed)

    async def move(self, sbx: SandboxContext, req: FsMove) -> FsEntry:
        paths = self._for(sbx)
        src, dst = paths.resolve(req.src), paths.resolve(req.dst)

        def work() -> None:
            self._refuse_protected(paths, src, "move")
            ops.move(
                paths.root,
                src,
                dst,
                overwrite=req.overwrite,
                make_parents=req.make_parents,
                new_owner=paths.new_owner,
            )

        await self._run(paths, work, src, walk=True)  # across filesystems it copies
        return await self._stat_reply(paths, dst, follow=False)

    async def copy(self, sbx: SandboxContext, req: FsCopy) -> FsEntry:
        paths = self._for(sbx)
        src, dst = paths.resolve(req.src), paths.resolve(req.dst)

        def work() -> None:
            ops.copy(
                paths.root,
                src,
                dst,
                recursive=req.recursive,
                overwrite=req.overwrite,
                make_parents=req.make_parents,
                new_owner=paths.new_owner,
            )

        await self._run(paths, work, src, walk=True)
        return await self._stat_reply(paths, dst, follow=False)

    async def chmod(self, sbx: SandboxContext, req: FsChmod) -> FsEntry:
        paths = self._for(sbx)
        host = paths.resolve(req.path)
        await self._run(
            paths,
            lambda: ops.chmod(paths.root, host, req.mode, recursive=req.recursive),
            host,
            walk=req.recursive,
        )
        return await self._stat_reply(paths, host)

    async def chown(self, sbx: SandboxContext, req: FsChown) -> FsEntry:
        paths = self._for(sbx)
        host = paths.resolve(req.path)

        def work() -> None:
            uid, gid = owner_ids(req.owner.uid, req.owner.gid, req.owner.user, req.owner.group)
            ops.chown(paths.root, host, uid, gid, recursive=req.recursive)

        await self._run(paths, work, host, walk=req.recursive)
        return await self._stat_reply(paths, host)
