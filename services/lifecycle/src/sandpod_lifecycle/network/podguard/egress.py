"""The guard's egress proxy: the local runtime's ``EgressProxy`` in the Pod, with the Pod's own
interception authorities and the injected secrets read from Kubernetes Secrets.

    sandbox uid: TCP 80/443 to a name-rule or injection-set address
      --nat_0 DNAT (podguard/firewall.py)--> 127.0.0.1:<proxy_port>
      --> EgressProxy (proxy.py, its own thread; lookups on the guard's loop): verdict.decide
          on the TLS SNI / HTTP Host and the guard resolver's record -> refuse / splice /
          intercept (header added from GuardSecrets) --> the real server (the guard's uid 0:
          unfiltered by the chain, so ``HardDenies`` -- metadata, loopback, link-local,
          ``SANDPOD_GUARD_HARD_DENY`` -- are checked by the proxy itself)

Secrets (``GuardSecrets``): an ``inject`` entry's ``secret: <Secret>/<key>`` names a key of a
Kubernetes Secret in the sandbox's namespace. The guard reads those Secrets with its own token
(its Role names them, and lifecycle re-applies the Role on every policy update) when a policy
arrives and every ``SANDPOD_GUARD_SECRET_REFRESH`` seconds, and keeps the values in memory only
(never a file, never the environment). The sandbox container mounts no token, runs under
another uid (no ``/proc/<guard>/environ`` or ``mem``) and sees only placeholders.

Authorities (``InterceptionCA`` in ``SANDPOD_GUARD_CA_DIR``, a memory emptyDir only the guard
mounts): one name-constrained authority per injected domain, as in the local runtime, but of
this Pod alone rather than of the installation: a Pod needs no copy of an installation-wide
key (which every guard would then hold), and a key that leaks from one Pod impersonates its
domains to that Pod only. Their certificates go to ``SANDPOD_GUARD_TRUST_FILE`` (an emptyDir the
sandbox container mounts read-only) on every policy change; the sandbox trusts them for the
named domains and nothing else. When the Pod's policy injected at its start, the init
container ``trust-bundle`` copied the image's system CA bundle beside them, and each rewrite also
rewrites ``bundle.pem`` (the two together, what the sandbox's commands trust by default:
``sandpod_kube.guardtrust``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import structlog
from prometheus_client import CollectorRegistry, Counter

from sandpod_contract.errors import StoreError
from sandpod_contract.network import NetworkPolicy
from sandpod_kube.guardpod import injected_secrets
from sandpod_kube.guardtrust import rebuild_bundle, replace_file
from sandpod_kube.guardwatch import read_secret_keys
from sandpod_lifecycle.network.ca import InterceptionCA
from sandpod_lifecycle.network.podguard.settings import GuardSettings
from sandpod_lifecycle.network.proxy import EgressProxy
from sandpod_lifecycle.network.proxyconfig import ResolvedNames
from sandpod_lifecycle.network.proxymetrics import ProxyMetrics
from sandpod_lifecycle.network.proxythread import ProxyThread, listen
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxLookup
from sandpod_lifecycle.network.secretstore import SecretNotFound
from sandpod_lifecycle.network.verdict import HardDenies

__all__ = ["GuardEgress", "GuardSecrets"]

log = structlog.get_logger("sandpod.lifecycle.network.podguard")


class GuardSecrets:
    """A ``SecretSource`` of ``<Secret>/<key>`` values read from the API server (module
    docstring). ``get`` runs on the proxy's thread: it reads a mapping replaced whole on each
    refresh (no lock, no torn state)."""

    def __init__(self, settings: GuardSettings) -> None:
        self._settings = settings
        self._values: Mapping[str, str] = {}
        self.complete = True  # every Secret the policy names was read at the last refresh

    def get(self, name: str) -> str:
        if "/" not in name:
            raise SecretNotFound(f"secret {name!r}: in a Pod, name it as <Secret>/<key>")
        try:
            return self._values[name]
        except KeyError:
            raise SecretNotFound(f"secret {name!r} is not readable by the guard") from None

    async def refresh(self, policy: NetworkPolicy) -> None:
        """Read every Secret ``policy`` injects from; one that cannot be read keeps its last
        values (a transient failure) or has none (never read: its injections fail closed), and
        :attr:`complete` turns False (the guard then retries soon: a grant may be on its way)."""
        s = self._settings
        values: dict[str, str] = {}
        complete = True
        for secret in injected_secrets(policy):
            try:
                keys = await read_secret_keys(s.kube, s.namespace, secret)
            except StoreError as exc:
                log.warning("guard_secret_unreadable", secret=secret, error=exc.message)
                complete = False
                prefix = f"{secret}/"
                values |= {k: v for k, v in self._values.items() if k.startswith(prefix)}
                continue
            values |= {f"{secret}/{key}": value for key, value in keys.items()}
        self._values = values
        self.complete = complete


class GuardEgress:
    """The proxy thread, its authorities and secrets, and the trust file (module docstring)."""

    def __init__(
        self,
        settings: GuardSettings,
        lookup: SandboxLookup,
        resolved_names: ResolvedNames,
        on_denied: Callable[[Denial], None],
        denied: Counter,
    ) -> None:
        """Raises CaError (the authority directory is unsafe), OSError (the port is taken)."""
        self.settings = settings
        self.secrets = GuardSecrets(settings)
        self.ca = InterceptionCA(settings.ca_dir, settings.sandbox_id)
        extra = tuple(settings.hard_deny)
        proxy = EgressProxy(
            settings.proxy,
            lookup=lookup,
            resolved_names=resolved_names,
            ca=self.ca,
            secrets=self.secrets,
            on_denied=on_denied,
            forbidden=HardDenies(extra),
            metrics=ProxyMetrics(CollectorRegistry(), denied=denied),
            owner_loop=asyncio.get_running_loop(),
        )
        port = settings.proxy_port or 0
        self.thread = ProxyThread(proxy, [listen("127.0.0.1", port)])
        self._domains: tuple[str, ...] | None = None

    def start(self) -> None:
        """Serve (raises RuntimeError when the thread did not come up)."""
        self.thread.start()

    async def stop(self) -> None:
        await asyncio.to_thread(self.thread.stop)

    async def follow(self, policy: NetworkPolicy) -> None:
        """What a new policy changes here: the secrets to read, the trust file."""
        await self.secrets.refresh(policy)
        domains = tuple(sorted({i.domain.name for i in policy.inject if i.domain.name}))
        if domains != self._domains:
            await asyncio.to_thread(self._write_trust, domains)
            self._domains = domains

    def _write_trust(self, domains: tuple[str, ...]) -> None:
        pem = self.ca.trust_pem(domains) if domains else ""
        target = self.settings.trust_file
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_file(target, pem.encode())  # the sandbox's uid reads it
        try:  # the image's bundle with them, when the Pod has one
            merged = rebuild_bundle(target)
        except OSError as exc:  # the certificates are written: a client told of them trusts
            log.error("guard_trust_bundle_failed", error=str(exc))
            merged = False
        log.info("guard_trust_written", domains=list(domains), path=str(target), bundle=merged)
