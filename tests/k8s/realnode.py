"""A real single-node Kubernetes cluster: the suite's ``real_node`` fixture and ``make cluster``.

What runs, all in the node's own network namespace (``k8s/nodenet.py``), as root:

    etcd, kube-apiserver                      deploy/envtest/build.sh (as the fast layer's)
    kube-controller-manager, kube-scheduler,  the same build's ``kube-node`` multi-call binary
    kubelet, kube-proxy (nftables mode)
    containerd + runc                         Debian's packages; config and state in our dirs
    gVisor's runsc (handler ``runsc``)        only when built (``make gvisor``): k8s/nodegvisor.py
    CNI bridge + host-local + portmap          Debian's containernetworking-plugins
    cluster DNS                                k8s/clusterdns.py (Services' names, no upstream)

The project's images (``build/images``: execd, base, services, pause, nats) are imported into
containerd's ``k8s.io`` namespace as ``sandpod.local/<name>:latest`` (``ctr images import``), so
nothing is pulled. State lives in ``workdir`` and ``/run/sandpod-node-<id>`` (unix sockets need
short paths); kubelet's cgroups under ``/sandpod-node-<id>``. :meth:`RealNode.stop` deletes every
Pod through the API first (the kubelet tears their sandboxes and networks down), then stops the
processes and sweeps what a crash may leave: mounts under our dirs, shims, Pod network namespaces.
A test run that dies without stopping its node (SIGKILL, a lost session) leaves it running: the
run dir's ``owner.json`` names the test process (pid and start time), and the next node to start
stops every node whose owner is gone (:func:`reap_orphans`; a live run's node is never touched).
The Pods' network namespaces of a reaped node (``cni-…``, not named after it) stay.
Registries: containerd reads ``<workdir>/certs.d/<host>/hosts.toml`` at every pull (CRI
``config_path``); :meth:`RealNode.trust_plain_http_registry` writes one for a test's plain-HTTP
registry, scoped to that one host (no global insecure setting; credentials stay the Pod's
``imagePullSecrets``).

Readiness is observed, never slept on: ``/readyz``, containerd's socket answering ``ctr
version``, and the Node's ``Ready`` condition.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client

from k8s import nodegvisor
from k8s.envtest import REPO, ControlPlane, binaries_dir, make_pki
from k8s.nodenet import KUBERNETES_SERVICE_IP, NodeNet
from sandpod_kube import KubeSettings

__all__ = [
    "IMAGE_PREFIX",
    "NODE_IMAGES",
    "TAG",
    "RealNode",
    "image",
    "missing_parts",
    "reap_orphans",
]

IMAGE_PREFIX = "sandpod.local"
NODE_IMAGES = (
    "sandpod-pause",
    "sandpod-nats",
    "sandpod-execd",
    "sandpod-base",
    "sandpod-lifecycle",
    "sandpod-pool",
    "sandpod-gateway",
)
NODE_NAME = "sandpod-node"
RUN_ROOT = Path("/run")
OWNER = "owner.json"  # in a node's run dir: the test process that runs it (see reap_orphans)
# The images' tag: the chart's appVersion, so the chart's defaults name them (a non-latest tag
# also makes the kubelet's default pull policy IfNotPresent: nothing is ever pulled).
TAG = next(
    line.split(":", 1)[1].strip().strip('"')
    for line in (REPO / "deploy/helm/sandpod/Chart.yaml").read_text().splitlines()
    if line.startswith("appVersion:")
)


def image(name: str) -> str:
    """The reference the node knows ``name`` (``sandpod-base`` ...) by."""
    return f"{IMAGE_PREFIX}/{name}:{TAG}"


API_PORT = 6443


def missing_parts(images: Path) -> str | None:
    """None when everything the node needs is installed and built, else what to run."""
    for tool, package in (
        ("containerd", "containerd"),
        ("runc", "runc"),
        ("nft", "nftables"),
        ("nsenter", "util-linux"),
    ):
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install {package}"
    if not Path("/usr/lib/cni/bridge").exists():
        return "CNI plugins not found: apt-get install containernetworking-plugins"
    if not os.access(binaries_dir() / "kube-node", os.X_OK):
        return f"kube-node not found in {binaries_dir()}: run deploy/envtest/build.sh"
    absent = [n for n in NODE_IMAGES if not (images / n / "index.json").exists()]
    if absent:
        return f"{', '.join(absent)} not in {images}: run `make cluster-images`"
    return None


class NodePlane(ControlPlane):
    """etcd + kube-apiserver inside the node's namespace, serving on the node's address."""

    def __init__(self, workdir: Path, net: NodeNet) -> None:
        super().__init__(workdir, (2379, 2380, API_PORT))
        self.net = net

    @property
    def url(self) -> str:
        return f"https://{self.net.node_ip}:{API_PORT}"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        # A session of its own, as every node process: a Ctrl-C meant for `make cluster` must
        # not reach the API server before the Pods are deleted through it.
        with (self.dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [*self.net.enter(), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def make_pki(self) -> None:
        make_pki(
            self.dir,
            sans=(
                self.net.node_ip,
                KUBERNETES_SERVICE_IP,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            clients=(
                ("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
                ("apiserver-kubelet", "kube-apiserver-kubelet-client", "system:masters"),
            ),
        )

    def apiserver_argv(self, etcd_url: str) -> list[str]:
        d = self.dir
        return [
            str(binaries_dir() / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.net.node_ip}",
            f"--secure-port={API_PORT}",
            f"--cert-dir={d / 'certs'}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            f"--kubelet-client-certificate={d / 'apiserver-kubelet.crt'}",
            f"--kubelet-client-key={d / 'apiserver-kubelet.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-cluster-ip-range={self.net.service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--allow-privileged=true",
            "--v=1",
        ]


class RealNode:
    """A whole single-node cluster; ``start()`` / ``stop()`` (see the module docstring)."""

    def __init__(self, workdir: Path, images: Path) -> None:
        self.dir = workdir
        self.images = images
        self.net: NodeNet | None = None
        self.plane: NodePlane | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.run_dir: Path | None = None
        self.cgroup_root = ""
        self.netns_before: set[str] = set()
        self._argv: dict[str, list[str]] = {}

    # -- public ------------------------------------------------------------------------------

    @property
    def settings(self) -> KubeSettings:
        if self.plane is None:
            raise RuntimeError("the node is not started")
        return self.plane.settings

    @property
    def socket(self) -> Path:
        if self.run_dir is None:
            raise RuntimeError("the node is not started")
        return self.run_dir / "containerd.sock"

    def start(self, progress: bool = False) -> None:
        def say(message: str) -> None:
            if progress:
                print(f"node: {message}", flush=True)

        for gone in reap_orphans():
            print(f"node: stopped {gone}, left by a test run that is gone", file=sys.stderr)
        self.netns_before = set(os.listdir("/run/netns")) if Path("/run/netns").is_dir() else set()
        self.net = net = NodeNet.up()
        ident = net.ident
        self.run_dir = RUN_ROOT / f"sandpod-node-{ident}"
        self.run_dir.mkdir(mode=0o700)
        owner = {"pid": os.getpid(), "start": _start_time(os.getpid()), "dir": str(self.dir)}
        (self.run_dir / OWNER).write_text(json.dumps({**owner, "octet": net.octet}))
        self.cgroup_root = f"/sandpod-node-{ident}"
        say(f"network namespace {net.netns}, node {net.node_ip}, pods {net.pod_cidr}")
        self.plane = NodePlane(self.dir / "plane", net)
        (self.dir / "plane").mkdir(parents=True)
        self.plane.start()
        say(f"kube-apiserver ready at {self.plane.url}")
        self._start_containerd()
        say("containerd ready; importing images")
        for name in NODE_IMAGES:
            self._import(name)
        say(f"imported {len(NODE_IMAGES)} images; starting the controllers and the kubelet")
        self._write_kubeconfigs()
        self._start_components()
        self._wait_node_ready()
        say(f"node {NODE_NAME} Ready")

    def stop(self) -> None:
        if self.plane is not None:
            with contextlib.suppress(Exception):
                self._delete_all_pods()
        for name in (
            "kubelet",
            "kube-proxy",
            "clusterdns",
            "kube-scheduler",
            "kube-controller-manager",
        ):
            self._terminate(name)
        self._kill_shims()
        self._terminate("containerd")
        if self.plane is not None:
            self.plane.stop()
        self._sweep_mounts()
        self._sweep_netns()
        self._sweep_cgroups()
        if self.net is not None:
            self.net.down()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def restart_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM, as systemd does) and start it again with the same state;
        returns once the Node is Ready again. Running containers are containerd's: they stay."""
        argv = self._argv.get("kubelet")
        if argv is None:
            raise RuntimeError("the kubelet was never started")
        self._terminate("kubelet")
        restarted = time.time()
        self._spawn("kubelet", argv)
        self._wait_node_ready(since=restarted)

    @property
    def registry_hosts(self) -> Path:
        """containerd's per-registry host configs (``<host>/hosts.toml``), read at each pull."""
        return self.dir / "certs.d"

    def trust_plain_http_registry(self, host: str) -> None:
        """Let the node pull from ``host`` (``ip:port``) over plain HTTP: a ``hosts.toml`` for
        that host only (containerd reads it at the next pull, no restart)."""
        d = self.registry_hosts / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(
            f'server = "http://{host}"\n\n[host."http://{host}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )

    def pids(self) -> set[int]:
        """The node's own processes (for the suite's leaked-process guard)."""
        plane = {p.pid for p in self.plane.procs} if self.plane is not None else set()
        return plane | {p.pid for p in self.procs.values()}

    def ctr(self, *args: str, input_file: Path | None = None) -> str:
        argv = ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args]
        with contextlib.ExitStack() as stack:
            stdin = stack.enter_context(input_file.open("rb")) if input_file else None
            done = subprocess.run(argv, stdin=stdin, capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode()

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.dir / f"{name}.log"
        if not path.exists() and self.plane is not None:
            return self.plane.log_tail(name, lines)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.net is not None
        self._argv[name] = argv
        with (self.dir / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [*self.net.enter(), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def _terminate(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def _start_containerd(self) -> None:
        assert self.run_dir is not None and self.net is not None
        root = self.dir / "containerd"
        cni = self.dir / "cni"
        (cni / "net.d").mkdir(parents=True)
        (cni / "net.d" / "10-sandpod.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "sandpod-node",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": self.net.pod_cidr}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(cni / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                }
            )
        )
        config = self.dir / "containerd.toml"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config.write_text(f"""version = 2
root = "{root / "root"}"
state = "{self.run_dir / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.run_dir / "ttrpc.sock"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[{cri}]
  sandbox_image = "{image("sandpod-pause")}"
  enable_unprivileged_ports = false
  # Root here may lack CAP_SYS_RESOURCE (a container host): no process may lower its OOM score
  # below its parent's, and runc fails a Pod sandbox at -998. Clamp at containerd's own score.
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{os.environ.get("SANDPOD_NODE_RUNC") or shutil.which("runc")}"
  SystemdCgroup = false
{nodegvisor.containerd_runtime(cri, self.run_dir / "gvisor")}[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni / "net.d"}"
[{cri}.registry]
  config_path = "{self.registry_hosts}"
""")
        self._spawn(
            "containerd",
            [
                "containerd",
                "--config",
                str(config),
                "--log-level",
                os.environ.get("SANDPOD_NODE_CONTAINERD_LOG", "warn"),
            ],
        )
        deadline = time.monotonic() + 60
        while True:
            self._check_alive()
            try:
                self.ctr("version")
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _import(self, name: str) -> None:
        """``build/images/<name>`` (an OCI layout) -> ``sandpod.local/<name>:<TAG>``."""
        tarball = self.dir / f"{name}.tar"
        subprocess.run(["tar", "-C", str(self.images / name), "-cf", str(tarball), "."], check=True)
        try:
            self.ctr("images", "import", "--base-name", f"{IMAGE_PREFIX}/{name}", str(tarball))
        finally:
            tarball.unlink()
        listed = self.ctr("images", "ls", "-q")
        if image(name) not in listed.split():
            raise RuntimeError(f"{name} was not imported (no '{TAG}' ref: `make cluster-images`)")

    def _write_kubeconfigs(self) -> None:
        assert self.plane is not None
        d = self.plane.dir
        for user, stem in (("kubelet", "kubelet"), ("admin", "admin")):
            (self.dir / f"{user}.kubeconfig").write_text(
                "apiVersion: v1\nkind: Config\ncurrent-context: node\n"
                f"clusters:\n- name: node\n  cluster:\n    server: {self.plane.url}\n"
                f"    certificate-authority: {d / 'ca.crt'}\n"
                f"users:\n- name: {user}\n  user:\n"
                f"    client-certificate: {d / (stem + '.crt')}\n"
                f"    client-key: {d / (stem + '.key')}\n"
                "contexts:\n- name: node\n  context: {cluster: node, user: "
                f"{user}}}\n"
            )

    def _start_components(self) -> None:
        assert self.plane is not None and self.net is not None
        node = str(binaries_dir() / "kube-node")
        admin = str(self.dir / "admin.kubeconfig")
        d = self.plane.dir
        self._spawn(
            "kube-controller-manager",
            [
                node,
                "kube-controller-manager",
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                f"--root-ca-file={d / 'ca.crt'}",
                f"--service-account-private-key-file={d / 'sa.key'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                f"--cluster-cidr={self.net.pod_cidr}",
                f"--service-cluster-ip-range={self.net.service_cidr}",
                "--allocate-node-cidrs=false",
                "--bind-address=127.0.0.1",
                "--secure-port=10257",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                node,
                "kube-scheduler",
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=10259",
                "--v=1",
            ],
        )
        proxy_config = self.dir / "kube-proxy.yaml"
        proxy_config.write_text(f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {{kubeconfig: {admin}}}
hostnameOverride: {NODE_NAME}
clusterCIDR: {self.net.pod_cidr}
bindAddress: {self.net.node_ip}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nftables: {{masqueradeAll: true}}
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
""")
        self._spawn("kube-proxy", [node, "kube-proxy", f"--config={proxy_config}", "--v=1"])
        resolv = self.dir / "resolv.conf"
        resolv.write_text(f"nameserver {self.net.node_ip}\n")
        kubelet_config = self.dir / "kubelet.yaml"
        kubelet_config.write_text(f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {self.cgroup_root}
containerRuntimeEndpoint: unix://{self.socket}
address: {self.net.node_ip}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {d / "ca.crt"}}}
authorization: {{mode: AlwaysAllow}}
clusterDNS: [{self.net.node_ip}]
clusterDomain: cluster.local
resolvConf: {resolv}
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}}
maxPods: 250
podPidsLimit: 4096
rotateCertificates: false
staticPodPath: ""
syncFrequency: 10s
# each node its own (not /var/log/pods): a kubelet's log GC deletes the pod log directories of
# Pods it does not know, so with two nodes at once one deleted the other's, and a termination
# message read from the logs was lost
podLogsDir: {self.dir / "pod-logs"}
""")
        self._spawn(
            "clusterdns",
            [
                sys.executable,
                str(REPO / "tests/k8s/clusterdns.py"),
                "--listen",
                self.net.node_ip,
                "--kubeconfig",
                admin,
            ],
        )
        self._make_cgroup_root()
        self._spawn(
            "kubelet",
            [
                node,
                "kubelet",
                f"--config={kubelet_config}",
                f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.net.node_ip}",
                "--v=1",
            ],
        )

    def _make_cgroup_root(self) -> None:
        """The kubelet's cgroup root, in every v1 hierarchy (it refuses a missing one); a new
        cpuset starts empty, so it gets its parent's CPUs and memory nodes."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if hierarchy.name == "unified" or not (hierarchy / "tasks").exists():
                continue
            top = hierarchy / self.cgroup_root[1:]
            top.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (top / knob).exists():
                    (top / knob).write_text((hierarchy / knob).read_text())

    def _wait_node_ready(self, timeout: float = 180, since: float = 0.0) -> None:
        """Until the Node is Ready (by a heartbeat after ``since``: a restarted kubelet's own)."""
        deadline = time.monotonic() + timeout
        last = "not registered"
        with self.settings.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    node = core.read_node(NODE_NAME)
                except client.ApiException as exc:
                    last = f"HTTP {exc.status}"
                else:
                    for cond in (node.status.conditions if node.status else None) or []:
                        if cond.type == "Ready":
                            beat = cond.last_heartbeat_time
                            fresh = beat is not None and beat.timestamp() >= since - 1
                            if cond.status == "True" and fresh:
                                return
                            last = f"{cond.reason}: {cond.message}"
                time.sleep(0.2)
        raise RuntimeError(f"node never Ready ({last}):\n{self.log_tail('kubelet')}")

    # -- teardown ----------------------------------------------------------------------------

    def _delete_all_pods(self, timeout: float = 60) -> None:
        with self.settings.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            for pod in core.list_pod_for_all_namespaces(_request_timeout=10).to_dict()["items"]:
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(
                        pod["metadata"]["name"],
                        pod["metadata"]["namespace"],
                        grace_period_seconds=0,
                        _request_timeout=10,
                    )
            deadline = time.monotonic() + timeout
            while (
                core.list_pod_for_all_namespaces(_request_timeout=10).items
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)

    def _kill_shims(self) -> None:
        """containerd's shims outlive it by design; ours are the ones naming our socket."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                cmdline
                and cmdline[0].endswith((b"containerd-shim-runc-v2", b"containerd-shim-runsc-v1"))
                and str(self.socket).encode() in cmdline
            ):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(pid), signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        if self.cgroup_root:  # every container process the kubelet put under our root
            for tasks in Path("/sys/fs/cgroup/pids").glob(f"{self.cgroup_root[1:]}/**/tasks"):
                for pid in tasks.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)

    def _kill_by_paths(self) -> None:
        """SIGKILL every process whose command line names our work or run directory (what a
        dead test run left: the plane, containerd, the kubelet, the shims), and wait for them."""
        marks = tuple(str(p).encode() for p in (self.dir, self.run_dir) if p is not None)
        killed = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if any(mark in cmdline for mark in marks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(pid) for pid in killed):
            time.sleep(0.05)

    def _sweep_mounts(self) -> None:
        prefixes = tuple(str(p) for p in (self.dir, self.run_dir) if p is not None)
        for _ in range(3):
            mounts = [
                line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            ]
            ours = [m for m in mounts if m.startswith(prefixes)]
            if not ours:
                return
            for target in sorted(ours, key=len, reverse=True):
                subprocess.run(["umount", "-l", target], capture_output=True, check=False)

    def _sweep_netns(self) -> None:
        """Pod network namespaces left behind (named ``cni-…``, not after this node): those
        made since it started that no process is in. Another node's live Pods' are made
        meanwhile too: deleting theirs made containerd report their sandboxes gone and their
        kubelet kill and restart their containers (a CI run's build test stuck its Pod in
        PodInitializing so)."""
        if not Path("/run/netns").is_dir():
            return
        used = _namespaces_in_use()
        for name in set(os.listdir("/run/netns")) - self.netns_before:
            if not name.startswith("cni-"):
                continue
            try:
                if os.stat(f"/run/netns/{name}").st_ino in used:
                    continue
            except OSError:
                continue
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)

    def _sweep_cgroups(self) -> None:
        if not self.cgroup_root:
            return
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.cgroup_root[1:]
            if not top.is_dir():
                continue
            for cg in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                with contextlib.suppress(OSError):
                    cg.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def _namespaces_in_use() -> set[int]:
    """The inodes of the network namespaces some process is in."""
    used = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                used.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
    return used


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot): a pid and this name one process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def reap_orphans(run_root: Path = RUN_ROOT) -> list[str]:
    """Stop the nodes of test runs that died without stopping them (a SIGKILL, a lost session):
    each ``sandpod-node-<id>`` run dir whose owner file names a process that is gone (or a pid
    now another process's). A node whose owner lives -- another test run on this host -- is
    never touched, nor is one without a readable owner file. Returns the run dirs stopped."""
    reaped = []
    for run_dir in sorted(run_root.glob("sandpod-node-*")):
        try:
            owner = json.loads((run_dir / OWNER).read_text())
            pid, start, workdir = int(owner["pid"]), owner["start"], Path(owner["dir"])
            net = NodeNet(run_dir.name.removeprefix("sandpod-node-"), int(owner["octet"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not workdir.is_absolute() or len(workdir.parts) < 3:
            continue  # never a directory whose name alone would match half the host
        if _running(pid) and _start_time(pid) == start:
            continue
        node = RealNode(workdir, Path())
        node.run_dir, node.net = run_dir, net
        node.cgroup_root = f"/sandpod-node-{net.ident}"
        node._kill_by_paths()
        node._kill_shims()
        node._sweep_mounts()
        node._sweep_cgroups()
        net.down()
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
        reaped.append(str(run_dir))
    return reaped


def main() -> None:
    """``make cluster``: start a node, print how to reach it, stop it on Ctrl-C."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="a real single-node cluster (tests/k8s)")
    parser.add_argument("--images", type=Path, default=REPO / "build/images")
    args = parser.parse_args()
    if (problem := missing_parts(args.images)) is not None:
        raise SystemExit(problem)
    node = RealNode(Path(tempfile.mkdtemp(prefix="sandpod-node-", dir="/var/tmp")), args.images)
    try:
        node.start(progress=True)
        print(
            f"node: export KUBECONFIG={node.dir / 'admin.kubeconfig'}; Ctrl-C stops it", flush=True
        )
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        print("node: stopping", flush=True)
        node.stop()
        shutil.rmtree(node.dir, ignore_errors=True)


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    main()
