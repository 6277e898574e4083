"""Sandpod's client side of the data-plane protocol, written once.

The SDK, the MCP server (through the SDK) and the gateway all talk to a sandbox's execd the same
way, so the protocol's client half lives here, below all three (an import contract keeps it
there: it imports only the bus and the contract):

- :mod:`sandpod_client.channel`: one sandbox's subjects; requests with the transport's "no
  responders" mapped to ``sandbox.not_found``.
- :mod:`sandpod_client.liveness`: probing execd while a long request waits, so a dead execd is
  a typed error within seconds, never a hang.
- :mod:`sandpod_client.oneshot`: ``exec.run`` with liveness, ``exec.fetch`` of the rest, and
  ``exec.cancel`` when the caller gives up.
- :mod:`sandpod_client.stream`: ``exec.start`` streams: order, acks, resume, keepalive, stdin,
  cancel.
- :mod:`sandpod_client.transfer`: pipelined ``fs.read`` and ``fs.write_*`` uploads.
"""

from sandpod_client.channel import CONTROL_TIMEOUT, NO_DEADLINE, Channel, Limits, Link
from sandpod_client.liveness import watch
from sandpod_client.oneshot import REPLY_SLACK, Completed, run_oneshot
from sandpod_client.stream import ExecStream
from sandpod_client.transfer import FileReader, FileUpload, read_range

__all__ = [
    "CONTROL_TIMEOUT",
    "NO_DEADLINE",
    "REPLY_SLACK",
    "Channel",
    "Completed",
    "ExecStream",
    "FileReader",
    "FileUpload",
    "Limits",
    "Link",
    "read_range",
    "run_oneshot",
    "watch",
]
