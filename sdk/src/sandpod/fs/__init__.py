"""The ``fs`` family: files in the sandbox (``sbx.fs``).

Same shape as every SDK family: ``api`` (the async client, given a
:class:`~sandpod.channel.Channel`), ``types`` (the values it returns), ``sync`` (the blocking
twin) and, where a family needs one, a named helper (here ``stream``, the pipelined chunked
reader and writer). This module lists the family's public names.
"""

from sandpod.fs.api import AsyncFiles
from sandpod.fs.stream import READ_LIMIT, AsyncFileReader, AsyncFileWriter, FileReader, FileWriter
from sandpod.fs.sync import Files
from sandpod.fs.types import (
    FileInfo,
    FileList,
    FileType,
    Replacement,
    ReplaceResult,
    SearchMatch,
    SearchResult,
    SkippedFile,
)

__all__ = [
    "READ_LIMIT",
    "AsyncFileReader",
    "AsyncFileWriter",
    "AsyncFiles",
    "FileInfo",
    "FileList",
    "FileReader",
    "FileType",
    "FileWriter",
    "Files",
    "ReplaceResult",
    "Replacement",
    "SearchMatch",
    "SearchResult",
    "SkippedFile",
]
