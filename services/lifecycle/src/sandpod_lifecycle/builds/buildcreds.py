"""NATS credentials of one builder Pod: the two things a build does on the bus, nothing more.

With NATS in operator mode (the lifecycle holds the account seed:
``SANDPOD_NATS_ACCOUNT_SEED_FILE``) each builder Pod gets its own user JWT, minted here and
written by ``builds.kube`` into a Secret owned by the template and deleted with the Pod. It may:

- publish the build's progress on ``<prefix>.events.template.<name>.build`` (that subject only);
- read the build-context object store (``copy`` steps' tars): the JetStream API subjects of that
  one bucket (``object_reader_subjects``: no write, no purge), replies arriving on an inbox
  prefix of its own (``_INBOX.build-<random>``), the only thing it may subscribe to -- never
  ``_INBOX.>``, where every other client's replies pass.

Nothing else: no control-plane API, no sandbox subjects, no other bucket. It expires with the
build's deadline (plus a margin). The template's ``run`` steps never see it: they run chrooted
into the chain's files, and the Secret is mounted in the Pod, outside.
"""

from __future__ import annotations

import dataclasses
import math
import secrets

from sandpod_bus.natsauth import Permissions, object_reader_subjects, user_creds
from sandpod_lifecycle.runtime.podcreds import CredsPolicy

__all__ = ["BuilderCreds", "builder_permissions", "mint_builder_creds"]

MARGIN = 300.0  # seconds a builder's JWT outlives the build deadline


@dataclasses.dataclass(frozen=True, slots=True)
class BuilderCreds:
    creds: str  # the creds file's text
    inbox: str  # the inbox prefix the builder must connect with
    expires: int  # the JWT's exp (unix seconds)


def builder_permissions(policy: CredsPolicy, template: str, inbox: str) -> Permissions:
    """What the builder of ``template`` may do on the bus (see the module docstring)."""
    subjects = policy.subjects
    bucket = subjects.storage("build-contexts")
    return Permissions(
        pub_allow=(
            subjects.event("template", template, "build"),
            *object_reader_subjects(bucket),
        ),
        sub_allow=(f"{inbox}.>",),
    )


def mint_builder_creds(
    policy: CredsPolicy, template: str, deadline: float, now: float
) -> BuilderCreds:
    """A fresh user for one build of ``template``, valid for ``deadline`` seconds plus a margin."""
    inbox = f"_INBOX.build-{secrets.token_hex(8)}"
    expires = math.ceil(now + deadline + MARGIN)
    perms = builder_permissions(policy, template, inbox)
    creds = user_creds(policy.account, f"builder:{template}", perms, now=int(now), expires=expires)
    return BuilderCreds(creds, inbox, expires)
