"""``files.identity``: a worker thread acting as another user gets exactly that user's rights for
every kind of file operation, while the other threads keep root's; it gives them back after."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sandpod_execd import inotify
from sandpod_execd.files.identity import Identity, IdentityError, acting, current
from sandpod_execd.files.rooted import Root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching identity needs root")

USER = Identity(65534, 65534, ())  # nobody / nogroup


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root 0600 and 0644 files, a root 0700 directory and a directory ``nobody`` owns."""
    tmp_path.chmod(0o755)
    (tmp_path / "secret").write_text("s")
    (tmp_path / "secret").chmod(0o600)
    (tmp_path / "public").write_text("p")
    (tmp_path / "public").chmod(0o644)
    (tmp_path / "priv").mkdir(mode=0o700)
    (tmp_path / "mine").mkdir()
    os.chown(tmp_path / "mine", USER.uid, USER.gid)
    return tmp_path


def on_thread(fn: Callable[[], object]) -> object:
    """Run ``fn`` on a fresh thread (as execd's workers); re-raise what it raised."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the caller
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def errno_of(fn: Callable[[], object]) -> int | None:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return None


def test_a_thread_acting_as_a_user_has_only_its_rights(tree: Path) -> None:
    root = Root(str(tree), jailed=True, identity=USER)

    def fd_call(path: str, fn: Callable[[str], object], flags: int = os.O_PATH) -> object:
        fd = root.open(path, flags)
        try:
            return fn(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

    def watch(path: str) -> None:
        ifd = inotify.init()
        try:
            fd_call(path, lambda p: inotify.add_watch(ifd, p, 0x100))
        finally:
            os.close(ifd)

    def checks() -> dict[str, int | None]:
        with root.acting():
            assert current() == USER
            made = root.open("/mine/new", os.O_WRONLY | os.O_CREAT, 0o644)
            st = os.fstat(made)
            os.close(made)
            assert (st.st_uid, st.st_gid) == (USER.uid, USER.gid)
            return {
                "read secret": errno_of(lambda: os.close(root.open("/secret", os.O_RDONLY))),
                "write public": errno_of(lambda: os.close(root.open("/public", os.O_WRONLY))),
                "chmod public": errno_of(lambda: fd_call("/public", lambda p: os.chmod(p, 0o666))),
                "utime public": errno_of(lambda: fd_call("/public", lambda p: os.utime(p, (0, 0)))),
                "chown own to root": errno_of(
                    lambda: fd_call("/mine/new", lambda p: os.chown(p, 0, -1))
                ),
                "chgrp own to root": errno_of(
                    lambda: fd_call("/mine/new", lambda p: os.chown(p, -1, 0))
                ),
                "rename public": errno_of(
                    lambda: os.rename(tree / "public", tree / "renamed")  # parent is root's
                ),
                "watch priv": errno_of(lambda: watch("/priv")),
                "read public": errno_of(lambda: os.close(root.open("/public", os.O_RDONLY))),
                "chown own to own": errno_of(
                    lambda: fd_call("/mine/new", lambda p: os.chown(p, USER.uid, USER.gid))
                ),
                "watch mine": errno_of(lambda: watch("/mine")),
            }

    got = on_thread(checks)
    denied = {errno.EACCES, errno.EPERM}
    assert isinstance(got, dict)
    refused = (
        "read secret",
        "write public",
        "chmod public",
        "utime public",
        "chown own to root",
        "chgrp own to root",
        "rename public",
        "watch priv",
    )
    for what in refused:
        assert got[what] in denied, what
    for what in ("read public", "chown own to own", "watch mine"):
        assert got[what] is None, what
    assert (tree / "public").read_text() == "p" and (
        tree / "public"
    ).stat().st_mode & 0o777 == 0o644


def test_other_threads_keep_roots_rights_and_the_switch_is_undone(tree: Path) -> None:
    root = Root(str(tree), jailed=True, identity=USER)
    inside, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def user() -> None:
        with root.acting():
            inside.set()
            release.wait(10)
            seen.append(errno_of(lambda: os.close(root.open("/secret", os.O_RDONLY))))
        seen.append(errno_of(lambda: os.close(root.open("/secret", os.O_RDONLY))))
        seen.append(current())

    t = threading.Thread(target=user)
    t.start()
    assert inside.wait(10)
    try:
        assert (tree / "secret").read_text() == "s"  # this thread, meanwhile: still root
        assert current() is None
    finally:
        release.set()
        t.join()
    assert seen == [errno.EACCES, None, None]


def test_nesting_and_mixing_identities() -> None:
    other = Identity(65533, 65533, ())

    def nest() -> object:
        with acting(USER), acting(USER):  # the same identity nests
            assert current() == USER
            with pytest.raises(IdentityError), acting(other):
                pass  # another sandbox's identity inside one is refused, never mixed
            return current()

    assert on_thread(nest) == USER
    assert current() is None
    with acting(None):
        assert current() is None


def test_a_kept_identity_stays_until_another_is_needed(tree: Path) -> None:
    """Workers keep the identity (no switch on the hot path); None or another identity switches
    them, and a block that found it kept leaves it kept."""
    root = Root(str(tree), jailed=True, identity=USER)

    def work() -> list[object]:
        seen: list[object] = []
        with root.acting(keep=True):
            pass
        seen.append(current())
        with root.acting():  # found it kept: leaves it kept
            pass
        seen.append(current())
        seen.append(errno_of(lambda: os.close(root.open("/secret", os.O_RDONLY))))
        with acting(None):  # execd's own work on this thread: switched back
            seen.append(errno_of(lambda: os.close(root.open("/secret", os.O_RDONLY))))
        seen.append(current())
        return seen

    assert on_thread(work) == [USER, USER, errno.EACCES, None, None]
