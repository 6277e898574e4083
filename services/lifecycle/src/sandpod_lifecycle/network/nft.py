"""nftables, driven in-process through libnftables (the library the ``nft`` tool itself uses).

One :class:`Nft` holds one libnftables context. :meth:`Nft.run` hands it a script in ``nft``'s
own syntax; a script is one kernel transaction: every command in it applies, or none does (an
error anywhere rolls the whole batch back). That is what makes a sandbox's policy swap atomic
(``flush chain`` + the new rules in one script). Calling the library costs ~100 µs per batch,
against a few milliseconds to fork ``nft``; Debian ships it as ``libnftables1``.

libnftables is not thread-safe per context: calls are serialised by a lock, so one :class:`Nft`
may be shared by the event loop's worker threads.
"""

from __future__ import annotations

import ctypes
import json
import threading
from typing import Any

__all__ = ["LIBRARY", "Nft", "NftError", "NftUnavailable"]

LIBRARY = "libnftables.so.1"
_OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON
_OUTPUT_HANDLE = 1 << 3  # NFT_CTX_OUTPUT_HANDLE


class NftError(Exception):
    """An nftables batch failed (nothing of it applied). ``code`` is stable; ``detail`` is the
    library's own message (for people, never matched on)."""

    code = "network.nft_failed"
    retryable = True

    def __init__(self, message: str, *, detail: str = "", script: str = "") -> None:
        super().__init__(f"{message}: {detail}" if detail else message)
        self.message = message
        self.detail = detail
        self.script = script


class NftUnavailable(NftError):
    """libnftables is missing, or the kernel refuses us (not root, no nf_tables)."""

    code = "network.nft_unavailable"
    retryable = False


class Nft:
    """One libnftables context (see the module docstring)."""

    def __init__(self, library: str = LIBRARY) -> None:
        try:
            lib = ctypes.CDLL(library, use_errno=True)
        except OSError as exc:
            raise NftUnavailable(
                f"cannot load {library} (Debian: apt-get install libnftables1)", detail=str(exc)
            ) from exc
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_ctx_output_get_flags.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_get_flags.restype = ctypes.c_uint
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            raise NftUnavailable("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        self._lib = lib
        self._ctx: int | None = ctx
        self._lock = threading.Lock()

    def run(self, script: str) -> str:
        """Run ``script`` (one transaction); return what it printed (``list`` commands).

        Raises:
            NftError: the batch failed; nothing of it applied.
        """
        return self._run(script, json_output=False)

    def json(self, command: str) -> list[dict[str, Any]]:
        """A ``list ...`` command's result as nftables JSON objects (the ``nftables`` array)."""
        out = self._run(command, json_output=True)
        if not out.strip():
            return []
        try:
            data = json.loads(out)
        except ValueError as exc:
            raise NftError("nft printed unreadable JSON", detail=str(exc), script=command) from exc
        items = data.get("nftables", []) if isinstance(data, dict) else []
        return [i for i in items if isinstance(i, dict)]

    def _run(self, script: str, *, json_output: bool) -> str:
        with self._lock:
            if self._ctx is None:
                raise NftError("the nftables context is closed")
            lib, ctx = self._lib, self._ctx
            flags = lib.nft_ctx_output_get_flags(ctx) & ~_OUTPUT_JSON
            lib.nft_ctx_output_set_flags(ctx, flags | (_OUTPUT_JSON if json_output else 0))
            rc = lib.nft_run_cmd_from_buffer(ctx, script.encode())
            out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
            err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace").strip()
        if rc != 0:
            first = script.strip().splitlines()[0] if script.strip() else ""
            raise NftError(f"nftables refused a batch ({first[:80]}...)", detail=err, script=script)
        return out

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None:
                self._lib.nft_ctx_free(self._ctx)
                self._ctx = None
