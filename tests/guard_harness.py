"""A stand-in for a sandbox Pod's network namespace, for the network guard's tests.

:class:`PodNetns` is a network namespace with a veth to the host (a random /30 of
198.18.0.0/15; default route via the host end, so the fake internet of ``fakenet.py`` is
reachable through the host's routes), ``/etc/netns/<name>/resolv.conf`` naming 127.0.0.1 (as
the guard's Pod spec does: ``dnsPolicy: None``) and its own ``hosts`` file. In it:

- :meth:`PodNetns.start_guard` runs ``python -m sandpod_lifecycle.network.podguard`` for real,
  as root with only CAP_NET_ADMIN and CAP_NET_BIND_SERVICE (``setpriv``: the capabilities the
  Pod spec gives the guard container), no-new-privs;
- :meth:`PodNetns.as_sandbox` runs a command as the "sandbox uid" (``setpriv --reuid``).

:class:`Relay` forwards TCP from an address the namespace can reach (the veth's host end) to
the test API server on 127.0.0.1: what a Service IP and kube-proxy are to a real Pod.
:func:`guard_token` makes a Sandbox's guard credential the way lifecycle does
(``sandpod_kube.guardpod``) and returns a TokenRequest token of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client

from dnsauth import AuthServer
from netns_pair import NetnsPair, ip
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.resources import NetworkStatus
from sandpod_kube import KubeSettings, KubeStore, PodApi
from sandpod_kube.guardpod import guard_access_manifests, guard_account_name
from sandpod_store import ObjectMeta, Resource

AUDIENCE = "https://kubernetes.default.svc"  # the test API server's issuer
GUARD_CAPS = "-all,+net_admin,+net_bind_service"


class PodNetns(NetnsPair):
    """The namespace standing in for a sandbox Pod's: DNS at 127.0.0.1 (the guard's), a
    default route to the host end (the "cluster" side), and the guard process."""

    def __init__(self) -> None:
        super().__init__("pod", nameserver="127.0.0.1")
        self.guard: subprocess.Popen[bytes] | None = None
        self.guard_log: Path | None = None

    def create(self) -> None:  # type: ignore[override]
        super().create(default_route=True, attempts=1)

    def add_ipv6(self) -> None:
        """IPv6 as in a dual-stack cluster: a ULA /64 on the veth (host end ``gateway6``, inside
        ``address6``), a default v6 route via the host end (which forwards: the fake internet's
        v6 side is reachable when the host has IPv6 forwarding on)."""
        a, b = (f"{random.randrange(1, 0xFFFF):x}" for _ in range(2))
        self.gateway6, self.address6 = f"fd7f:{a}:{b}::1", f"fd7f:{a}:{b}::2"
        ip("addr", "add", f"{self.gateway6}/64", "dev", self.host_if, "nodad")
        ip("-n", self.name, "addr", "add", f"{self.address6}/64", "dev", self.peer_if, "nodad")
        ip("-n", self.name, "-6", "route", "add", "default", "via", self.gateway6)

    def start_guard(self, env: dict[str, str], log: Path, caps: str = GUARD_CAPS) -> None:
        """The guard's entry point, in the namespace, with the guard container's capabilities
        (``caps``: a setpriv bounding set, to run it with fewer)."""
        argv = [
            "ip",
            "netns",
            "exec",
            self.name,
            "setpriv",
            "--no-new-privs",
            "--inh-caps=-all",
            f"--bounding-set={caps}",
            sys.executable,
            "-m",
            "sandpod_lifecycle.network.podguard",
        ]
        self.guard_log = log
        own = {  # the guard's memory emptyDir and the trust emptyDir, here
            "SANDPOD_GUARD_CA_DIR": str(log.parent / "guard-ca"),
            "SANDPOD_GUARD_TRUST_FILE": str(log.parent / "trust" / "egress.pem"),
        }
        with log.open("ab") as out:
            self.guard = subprocess.Popen(
                argv, env={**os.environ, **own, **env}, stdout=out, stderr=subprocess.STDOUT
            )

    def stop_guard(self) -> int | None:
        if self.guard is None:
            return None
        if self.guard.poll() is None:
            self.guard.terminate()
            try:
                self.guard.wait(15)
            except subprocess.TimeoutExpired:
                self.guard.kill()
                self.guard.wait(5)
        code = self.guard.returncode
        self.guard = None
        return code

    async def as_sandbox(self, uid: int, *argv: str, timeout: float = 30) -> tuple[int, str]:
        """(exit code, stdout) of ``argv`` run in the namespace as ``uid``."""
        proc = await asyncio.create_subprocess_exec(
            "ip",
            "netns",
            "exec",
            self.name,
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
            *argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        assert proc.returncode is not None
        return proc.returncode, out.decode()

    def nft(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, "nft", *args], capture_output=True, text=True
        )

    def remove(self) -> None:
        self.stop_guard()
        super().remove()


class Relay:
    """TCP from ``(host, 0)`` to ``target``, byte for byte (a Service IP for the namespace)."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.host, self.target = host, target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        self._writers.add(up_writer)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._tasks.discard(task)

    async def close(self) -> None:
        """Stop listening; end every relayed connection by closing its sockets (never by
        cancelling: the server's callback would log a cancelled handler as an error)."""
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        async with asyncio.timeout(10):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


async def create_sandbox(store: KubeStore, namespace: str, name: str) -> Resource:
    return await store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="Sandbox",
            metadata=ObjectMeta(name=name, namespace=namespace),
            spec={"templateRef": {"name": "python"}},
        )
    )


async def set_policy(store: KubeStore, namespace: str, name: str, policy: NetworkPolicy) -> None:
    """Write ``status.network`` as lifecycle does after applying ``policy``."""
    current = await store.get("Sandbox", namespace, name)
    status = dict(current.status)
    status["network"] = NetworkStatus(policy=policy, source="sandbox", enforced=True).to_dict()
    await store.update_status(dataclasses.replace(current, status=status))


def owner_of(sandbox: Resource) -> dict[str, Any]:
    return {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "Sandbox",
        "name": sandbox.metadata.name,
        "uid": sandbox.metadata.uid,
        "controller": True,
    }


async def guard_token(admin: KubeSettings, sandbox: Resource) -> str:
    """Lifecycle's guard access objects for ``sandbox`` (applied with ``PodApi``), and a
    token of its guard ServiceAccount (TokenRequest, as the kubelet's projection gets one)."""
    ns, name = sandbox.metadata.namespace, sandbox.metadata.name
    api = PodApi(admin)
    try:
        await api.apply_guard_access(guard_access_manifests(ns, name, owner_of(sandbox), {}))
    finally:
        await api.close()

    def request() -> str:
        with admin.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            body = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
            )
            answer = core.create_namespaced_service_account_token(
                guard_account_name(name), ns, body
            )
            assert answer.status is not None
            return str(answer.status.token)

    return await asyncio.to_thread(request)


class PodGuards:
    """The fake kubelet's ``guard_runner``: each Pod's guard, from the Pod's own spec and env,
    in a :class:`PodNetns` of its own, with the cluster's parts the namespace can reach: a
    test DNS server (``records``) and a relay to the API server on the veth's host end, and
    the token of the Pod's ``serviceAccountName`` (TokenRequest, as the kubelet projects it).
    ``netns`` maps Pod names to their namespaces; :meth:`close` removes everything."""

    def __init__(
        self,
        admin: KubeSettings,
        api_port: int,
        ca_file: Path,
        state: Path,
        records: list[tuple[str, str]],
    ) -> None:
        self.admin, self.api_port, self.ca_file, self.state = admin, api_port, ca_file, state
        self.records = records
        self.env: dict[str, str] = {}  # more of the guard's environment (a test's knobs)
        self.ipv6 = False  # give each Pod's namespace IPv6 too (``PodNetns.add_ipv6``)
        self.netns: dict[str, PodNetns] = {}
        self.api_urls: dict[str, str] = {}  # the API server as each Pod reaches it
        self.auth: dict[str, AuthServer] = {}
        self._relays: list[Relay] = []

    async def __call__(self, raw: dict[str, Any], env: dict[str, str]) -> None:
        name, ns = raw["metadata"]["name"], raw["metadata"]["namespace"]
        pod = PodNetns()
        self.netns[name] = pod
        pod.create()
        if self.ipv6:
            pod.add_ipv6()
        auth = AuthServer(pod.gateway)
        for host, address in self.records:
            auth.add(host, "A", 300, address)
        await auth.start()
        self.auth[name] = auth
        relay = Relay(pod.gateway, ("127.0.0.1", self.api_port))
        await relay.start()
        self._relays.append(relay)
        self.api_urls[name] = f"https://{pod.gateway}:{relay.port}"
        root = self.state / name
        root.mkdir(parents=True)
        token = root / "token"
        account = raw["spec"]["serviceAccountName"]
        token.write_text(await asyncio.to_thread(self._token, ns, account))
        ready = root / "ready"
        pod.start_guard(
            {
                **env,
                "SANDPOD_DNS_UPSTREAMS": f"{auth.host}:{auth.port}",  # the cluster DNS, here
                "SANDPOD_KUBE_SERVER": f"https://{pod.gateway}:{relay.port}",  # the Service IP
                "SANDPOD_KUBE_TLS_SERVER_NAME": "localhost",
                "SANDPOD_KUBE_CA_FILE": str(self.ca_file),  # the projected volume's files
                "SANDPOD_KUBE_TOKEN_FILE": str(token),
                "SANDPOD_GUARD_READY_FILE": str(ready),
                "SANDPOD_GUARD_CA_DIR": str(root / "guard-ca"),  # its memory emptyDir
                "SANDPOD_GUARD_TRUST_FILE": str(root / "trust" / "egress.pem"),  # the shared one
                **self.env,
            },
            root / "guard.log",
        )
        async with asyncio.timeout(60):  # the startup probe
            while not ready.exists():
                assert pod.guard is not None and pod.guard.poll() is None, (
                    root / "guard.log"
                ).read_text()
                await asyncio.sleep(0.05)  # a file appearing: no event to wait on

    def _token(self, namespace: str, account: str) -> str:
        with self.admin.api_client() as api_client:
            body = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
            )
            answer = client.CoreV1Api(api_client).create_namespaced_service_account_token(
                account, namespace, body
            )
            assert answer.status is not None
            return str(answer.status.token)

    async def close(self) -> None:
        # in a thread: the relays on this loop must serve the guards' last API calls meanwhile
        codes = {name: await asyncio.to_thread(pod.stop_guard) for name, pod in self.netns.items()}
        for pod in self.netns.values():
            pod.remove()
        for relay in self._relays:
            await relay.close()
        for auth in self.auth.values():
            await auth.close()
        assert all(code in (0, None) for code in codes.values()), codes
