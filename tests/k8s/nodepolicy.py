"""NetworkPolicy on the real test node: kube-network-policies, with its packets queued by iptables.

The node's CNI (bridge) enforces no NetworkPolicy. ``sigs.k8s.io/kube-network-policies`` (built
by ``deploy/envtest/build-netpol.sh``) is an agent for any CNI: it watches Pods, Namespaces and
NetworkPolicies and decides each new connection of a Pod in user space, on packets the kernel
hands it through nfqueue. It programs that hand-over as an nftables table whose rules use the
nftables ``queue`` expression, which this machine's kernel lacks (``CONFIG_NFT_QUEUE`` is not
set: its table is refused whole, "netlink receive: no such file or directory"). The kernel does
have the iptables ``NFQUEUE`` target, so :class:`PolicyAgent` runs the agent unchanged and adds
the same hand-over with iptables, mirroring the agent's own chain (``postrouting``, before
SNAT), in the node's network namespace only::

    mangle POSTROUTING  udp dport 53           accept   (the agent's DNS race workaround)
                        local sockets of uid 0 accept   (the agent's "node's root" exemption)
                        ct state new, saddr in the Pod CIDR -> NFQUEUE 100 (the agent's verdict)
                        ct state new, daddr in the Pod CIDR -> NFQUEUE 100
    net.bridge.bridge-nf-call-iptables = 1     (Pods on one bridge: their packets see the hooks)

Every verdict is the agent's; only the queueing is ours. Like the agent itself, nothing here
polices packets *to the node* (the node's address, a Service that DNATs to it): they take the
input path, never postrouting.

The agent reads the API server as in a Pod (``rest.InClusterConfig`` only): it runs in a private
mount namespace with a tmpfs on ``/run`` holding its ServiceAccount's token, CA and namespace,
and ``KUBERNETES_SERVICE_HOST`` set to the node's address. Its RBAC is a ClusterRole of its own
(read Pods, Namespaces, Nodes and NetworkPolicies; write Events). :meth:`PolicyAgent.stop`
removes the iptables rules before the agent exits (a queue without a reader drops packets),
restores the sysctl and deletes the RBAC objects.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from k8s.realnode import NODE_NAME, RealNode

__all__ = ["PolicyAgent", "agent_binary", "missing_agent"]

VERSION = "v0.8.0"
QUEUE = 100
NAME = "sandpod-netpol"
NAMESPACE = "kube-system"
SA_DIR = "/run/secrets/kubernetes.io/serviceaccount"
# $1: the token directory, $2: the binary, $3: the API server's address; the rest: its flags
RUN = f'mount -t tmpfs none /run && mkdir -p {SA_DIR} && cp "$1"/* {SA_DIR}/ && ' + (
    'export KUBERNETES_SERVICE_HOST="$3" KUBERNETES_SERVICE_PORT=6443 && exe="$2" && '
    'shift 3 && exec "$exe" "$@"'
)
RULES: list[list[str]] = [
    ["-p", "udp", "--dport", "53", "-j", "ACCEPT"],
    ["-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"],
]
BRIDGE_SYSCTL = "net.bridge.bridge-nf-call-iptables"
AUDIENCE = "https://kubernetes.default.svc"  # the node API server's issuer


def agent_binary() -> Path:
    root = os.environ.get("SANDPOD_ENVTEST_DIR") or str(Path.home() / ".cache/sandpod/envtest")
    return Path(root) / f"netpol-{VERSION}" / "bin" / "kube-network-policies"


def missing_agent() -> str | None:
    """None when the agent and iptables are installed, else what to run."""
    if shutil.which("iptables") is None:
        return "iptables not found: apt-get install iptables"
    if not os.access(agent_binary(), os.X_OK):
        return f"{agent_binary()} not found: run deploy/envtest/build-netpol.sh"
    return None


def _rbac() -> tuple[client.V1ClusterRole, client.V1ClusterRoleBinding]:
    meta = client.V1ObjectMeta(name=NAME)
    read = ["get", "list", "watch"]
    role = client.V1ClusterRole(
        metadata=meta,
        rules=[
            client.V1PolicyRule(
                api_groups=[""], resources=["pods", "namespaces", "nodes"], verbs=read
            ),
            client.V1PolicyRule(
                api_groups=["networking.k8s.io"], resources=["networkpolicies"], verbs=read
            ),
            client.V1PolicyRule(
                api_groups=["", "events.k8s.io"],
                resources=["events"],
                verbs=["create", "patch", "update"],
            ),
        ],
    )
    binding = client.V1ClusterRoleBinding(
        metadata=meta,
        role_ref=client.V1RoleRef(
            api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=NAME
        ),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=NAME, namespace=NAMESPACE)],
    )
    return role, binding


class PolicyAgent:
    """kube-network-policies on ``node`` (module docstring): :meth:`start`, :meth:`stop`."""

    def __init__(self, node: RealNode) -> None:
        assert node.net is not None and node.plane is not None
        self.node = node
        self.net = node.net
        self.dir = node.dir / "netpol"
        self.proc: subprocess.Popen[bytes] | None = None
        self._rules: list[list[str]] = []
        self._bridge_was = "0"

    def _in_node(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(
            [*self.net.enter(), *argv], capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def start(self, timeout: float = 60) -> None:
        """Run the agent, wait until it reads its queue, then queue the Pods' new connections."""
        self.dir.mkdir(exist_ok=True)
        self._grant()
        log = (self.dir / "agent.log").open("ab")
        flags = [
            f"--hostname-override={NODE_NAME}",
            "--disable-nri",  # containerd 1.6 has no NRI: Pod IPs come from the API server
            f"--nfqueue-id={QUEUE}",
            "--metrics-bind-address=127.0.0.1:19080",
            "--v=2",
        ]
        secrets = self.dir / "sa"
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", RUN, "sh"]
        argv += [str(secrets), str(agent_binary()), self.net.node_ip, *flags]
        with log:
            self.proc = subprocess.Popen(
                [*self.net.enter(), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._queue_bound():  # nfnetlink_queue lists a queue once a reader binds it
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kube-network-policies did not bind its queue:\n{self.tail()}")
            time.sleep(0.1)  # a /proc line appearing: no event to wait on
        self._bridge_was = self._in_node("sysctl", "-n", BRIDGE_SYSCTL).strip()
        self._in_node("sysctl", "-q", "-w", f"{BRIDGE_SYSCTL}=1")
        queue = ["-m", "conntrack", "--ctstate", "NEW", "-j", "NFQUEUE", "--queue-num", str(QUEUE)]
        cidr = self.net.pod_cidr
        for rule in [*RULES, ["-s", cidr, *queue], ["-d", cidr, *queue]]:
            self._in_node("iptables", "-t", "mangle", "-A", "POSTROUTING", *rule)
            self._rules.append(rule)

    def _queue_bound(self) -> bool:
        table = self._in_node("cat", "/proc/net/netfilter/nfnetlink_queue", check=False)
        return any(line.split()[:1] == [str(QUEUE)] for line in table.splitlines())

    def tail(self, lines: int = 30) -> str:
        path = self.dir / "agent.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Rules first (a queue with no reader drops), then the agent, the sysctl, the RBAC."""
        for rule in reversed(self._rules):
            self._in_node("iptables", "-t", "mangle", "-D", "POSTROUTING", *rule, check=False)
        self._rules = []
        self._in_node("sysctl", "-q", "-w", f"{BRIDGE_SYSCTL}={self._bridge_was}", check=False)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        self._revoke()

    def _grant(self) -> None:
        """The agent's ServiceAccount, ClusterRole and binding, and a token of it in ``sa/``."""
        with self.node.settings.api_client() as api:
            core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
            _create(
                lambda: core.create_namespaced_service_account(
                    NAMESPACE, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=NAME))
                )
            )
            role, binding = _rbac()
            _create(lambda: rbac.create_cluster_role(role))
            _create(lambda: rbac.create_cluster_role_binding(binding))
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
            )
            answer = core.create_namespaced_service_account_token(NAME, NAMESPACE, request)
        assert answer.status is not None and self.node.plane is not None
        secrets = self.dir / "sa"
        secrets.mkdir(exist_ok=True)
        (secrets / "token").write_text(str(answer.status.token))
        (secrets / "ca.crt").write_bytes(self.node.plane.ca_file.read_bytes())
        (secrets / "namespace").write_text(NAMESPACE)

    def _revoke(self) -> None:
        with self.node.settings.api_client() as api:
            core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
            deletes: list[Callable[[], object]] = [
                lambda: rbac.delete_cluster_role_binding(NAME),
                lambda: rbac.delete_cluster_role(NAME),
                lambda: core.delete_namespaced_service_account(NAME, NAMESPACE),
            ]
            for delete in deletes:
                try:
                    delete()
                except ApiException as exc:
                    if exc.status != 404:
                        raise


def _create(call: Callable[[], object]) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 409:
            raise
