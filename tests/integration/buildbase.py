"""A host-root-free base for template build tests: a few host programs and their libraries.

Builds stack layers over a base directory (never the host root), and the isolation tests need
a base in which nothing of the host exists but what is copied here: dash, coreutils' basics,
their shared libraries (found with ``ldd``), a root-only ``/etc/passwd``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["PROGRAMS", "minimal_rootfs"]

PROGRAMS: tuple[str, ...] = ("sh", "sleep", "umount", "cat", "ls", "mkdir", "rm", "env", "id")
PROGRAMS += ("head", "seq", "touch", "stat", "printf", "dd", "wc", "tr")


def minimal_rootfs(root: Path) -> Path:
    """Fill ``root`` (created) with :data:`PROGRAMS` under ``/usr/bin`` (``/bin`` a link)."""
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    for program in PROGRAMS:
        real = Path(shutil.which(program) or f"/bin/{program}").resolve()
        listing = subprocess.check_output(["ldd", str(real)], text=True)
        for lib in re.findall(r"(/\S+\.so[.\d]*)", listing):
            dest = root / lib.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                shutil.copy2(lib, dest)
        shutil.copy2(real, root / "usr" / "bin" / program)
    return root
