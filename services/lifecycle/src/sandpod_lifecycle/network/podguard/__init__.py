"""``sandpod-netguard``: the sandbox's network guard in a Kubernetes Pod (issue 15, part 5).

A NetworkPolicy has no DNS names and no per-Pod narrowing; the guard brings the local runtime's
enforcement into the Pod: a native sidecar (an init container with ``restartPolicy: Always``
and a startup probe, so the sandbox container starts only once the guard enforces) in the
Pod's network namespace, with only CAP_NET_ADMIN (its nftables table) and
CAP_NET_BIND_SERVICE (the resolver on port 53). Modules:

| module | what |
|---|---|
| ``settings.py`` | ``GuardSettings`` from the environment (the table of variables) |
| ``firewall.py`` | ``PodFirewall``: its table, chain by ``rules.compile_chain`` |
| ``guard.py`` | ``Guard``: table + resolver (``resolver.py``) + the watch of its own Sandbox |
| ``egress.py`` | ``GuardEgress``: the egress proxy, the Pod's authorities, ``GuardSecrets`` |
| ``report.py`` | refusals -> the Sandbox's report ConfigMap -> lifecycle's events |
| ``__main__.py`` | ``python -m sandpod_lifecycle.network.podguard`` |

Run: ``python -m sandpod_lifecycle.network.podguard`` (the lifecycle image).
"""
