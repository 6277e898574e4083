"""The embedded NATS's credentials (``sandpod_lifecycle.embedded_auth``), the SDK's lookup of the
local client credential, and execd's trusted jail file read: files, modes and refusals."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from sandpod.config import local_client_creds, resolve_nats_creds
from sandpod_bus.natsauth import creds_jwt, decode_jwt, object_subjects, operator_setup, user_creds
from sandpod_contract.errors import SandboxJailRefused
from sandpod_contract.subjects import Subjects
from sandpod_execd.jailfile import load_trusted
from sandpod_lifecycle.bus_users import embedded_users, kubernetes_users
from sandpod_lifecycle.embedded_auth import USERS, embedded_permissions, provision


def test_provision_makes_keys_once_and_every_file_0600(tmp_path: Path) -> None:
    """A second provision reuses the operator and account (creds minted earlier stay valid);
    the directory is 0700 and every file in it 0600."""
    first = provision(tmp_path / "state", "sandpod", "n1", int(time.time()))
    conf = first.server_conf.read_text()
    seed = first.account_seed.read_text()
    again = provision(tmp_path / "state", "sandpod", "n1", int(time.time()))
    assert again.server_conf.read_text() == conf and again.account_seed.read_text() == seed
    assert stat.S_IMODE(first.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    files = sorted(first.directory.iterdir())
    assert {f.name for f in files} >= {f"{u}.creds" for u in USERS} | {"account.seed"}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files), files
    for user in USERS:  # each creds file is signed by the one app account
        claims = decode_jwt(creds_jwt(first.creds(user).read_text()))
        assert claims["name"] == f"sandpod-{user}" and claims["iss"] in conf


def test_only_lifecycle_may_publish_on_the_node_plane() -> None:
    """The node plane and JetStream are in no one's allow list but the owning services' (and
    the client's build-context uploads)."""
    perms = embedded_permissions(Subjects("sandpod"), "n1")
    node = "sandpod.node.>"
    assert [u for u, p in perms.items() if node in p.pub_allow] == ["lifecycle"]
    # the client's only JetStream: the object store of template builds' files
    uploads = set(object_subjects("sandpod-build-contexts"))
    client_js = {s for s in perms["client"].pub_allow if s.startswith(("$JS", "$KV", "$O"))}
    assert client_js == uploads
    assert not any(s.startswith(("$JS", "$KV")) for s in perms["execd"].pub_allow)
    assert "$KV.sandpod-gateway-keys.>" in perms["gateway"].pub_allow
    assert not any(
        "gateway-keys" in s
        for u in ("lifecycle", "pool", "client", "execd")
        for s in perms[u].pub_allow
    )
    assert perms["execd"].sub_allow == ("sandpod.sbx.*.>", "sandpod.node.n1.execd.*")


def test_sdk_finds_the_local_client_creds_and_explicit_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no explicit creds and no ``SANDPOD_NATS_CREDS``, the SDK uses the state dir's
    client.creds when it exists; an argument or the variable wins over it."""
    monkeypatch.delenv("SANDPOD_NATS_CREDS", raising=False)
    monkeypatch.setenv("SANDPOD_STATE_DIR", str(tmp_path))
    assert resolve_nats_creds() is None
    local = local_client_creds()
    assert local == tmp_path / "nats-auth" / "client.creds"
    local.parent.mkdir()
    local.write_text("creds")
    assert resolve_nats_creds() == str(local)
    assert resolve_nats_creds("/explicit.creds") == "/explicit.creds"
    monkeypatch.setenv("SANDPOD_NATS_CREDS", "/from-env.creds")
    assert resolve_nats_creds() == "/from-env.creds"


def _jail(tmp_path: Path, mode: int = 0o600, owner: int | None = None) -> Path:
    d = tmp_path / "jails" / "sbx1"
    d.mkdir(parents=True, mode=0o700)
    path = d / "jail.json"
    path.write_text(json.dumps({"version": 1, "sandbox_id": "sbx1", "phase": "creating"}))
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner, -1)
    return path


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("missing", "no jail"),
        ("world_writable", "writable by group or others"),
        ("group_writable", "writable by group or others"),
        ("other_owner", "owned by uid"),
        ("symlink", "no jail"),
        ("dir_writable", "its directory is writable"),
        ("not_running", "unusable"),
    ],
)
def test_untrusted_jail_files_are_refused(tmp_path: Path, case: str, why: str) -> None:
    """execd reads a jail file only if root (or its own uid) owns it and its directory and no one
    else can write them; anything else is ``sandbox.jail_refused`` with the reason."""
    if case == "other_owner" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root: run the unit tests as root")
    path = tmp_path / "jails" / "sbx1" / "jail.json"
    if case == "missing":
        path.parent.mkdir(parents=True)
    elif case == "world_writable":
        _jail(tmp_path, 0o646)
    elif case == "group_writable":
        _jail(tmp_path, 0o620)
    elif case == "other_owner":
        _jail(tmp_path, owner=65534)
    elif case == "symlink":
        real = _jail(tmp_path)
        moved = real.with_name("real.json")
        real.rename(moved)
        path.symlink_to(moved)
    elif case == "dir_writable":
        _jail(tmp_path).parent.chmod(0o777)
    else:
        _jail(tmp_path)  # phase "creating": trusted, but not a running jail
    with pytest.raises(SandboxJailRefused) as refused:
        load_trusted(path, "sbx1")
    assert why in refused.value.message and refused.value.code == "sandbox.jail_refused"


def test_kubernetes_users_are_the_embedded_ones_without_node_plane_kv_and_execd() -> None:
    """One definition for both modes: Kubernetes mode drops only the node plane, the KV store
    and lease buckets (the API server holds both), the execd user (Pods use sandbox creds) and
    the lifecycle's reading of build contexts (builder Pods read them as users of their own);
    the client uploads build contexts in both modes; snapshot layers are the lifecycle's in
    both (Kubernetes mode snapshots Pods through their execd)."""
    s = Subjects("sandpod")
    embedded, kube = embedded_users(s, "n1"), kubernetes_users(s)
    assert set(kube) == set(embedded) - {"execd"}
    dropped = (
        *("sandpod.node.", "$KV.sandpod-resources.", "$KV.sandpod-leases."),
        "$O.sandpod-build-contexts.",  # the lifecycle reads contexts only where it builds
    )
    assert kube["client"] == embedded["client"]
    for user, perms in kube.items():
        if user == "client":
            continue
        assert perms.sub_allow == embedded[user].sub_allow, user
        kept = tuple(
            x
            for x in embedded[user].pub_allow
            if not x.startswith(dropped)
            and "KV_sandpod-resources" not in x
            and "KV_sandpod-leases" not in x
            and "OBJ_sandpod-build-contexts" not in x
        )
        assert set(perms.pub_allow) == set(kept), user  # (the same grants, reordered)
    assert kube["gateway"] == embedded["gateway"]
    assert not any(
        x.startswith(("sandpod.node", "$KV.sandpod-res", "$KV.sandpod-lea"))
        for p in kube.values()
        for x in p.pub_allow
    )


def test_every_service_jwt_fits_the_servers_connect_line() -> None:
    """A user JWT travels in its CONNECT line, which nats-server caps at 4 KiB (a larger one
    is dropped at connect, "cannot connect"): with the default prefix every embedded user's
    fits, with room (template builds' grants made the lifecycle's the largest)."""
    setup = operator_setup(int(time.time()))
    for name, perms in embedded_users(Subjects("sandpod"), "node-1").items():
        jwt = creds_jwt(user_creds(setup.app.key, name, perms, now=int(time.time())))
        assert len(jwt) < 3800, (name, len(jwt))
