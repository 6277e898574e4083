"""The installation's NFLOG group: a netlink socket the kernel sends refused packets to.

NFLOG groups (0..65535) belong to a network namespace, and the kernel gives each to one socket
(a second bind is refused with ``EPERM``). Another installation on the host (another ``sandpod
up``), or any other program, may hold a group already, so :meth:`NflogSocket.bind` starts at
a number derived from the installation id (:func:`preferred_group`) and takes the first free
one of ``attempts``; the egress writes the group it got into the rules (``log group <n>``,
``rules.py``). A restarted lifecycle usually gets the same number back, and re-applies its
chains with whatever it got.

The socket asks for copy mode ``packet`` with ``copy_range`` bytes (an IP header with options
plus the ports: the destination is all we read) and one packet per datagram; its receive
buffer is ``rcvbuf`` bytes: when the kernel finds it full it drops the log message and the next
``recv`` fails with ``ENOBUFS``, which the reader counts and reads on (``denials.py``). Bytes
are parsed by ``nflogwire.py``. :meth:`NflogSocket.close` unbinds the group and closes the
socket (the kernel would drop the group when the socket goes anyway).

We never send ``PF_BIND``: that would make nfnetlink_log the host's default logger for a whole
protocol family; ``log group`` rules reach it without.
"""

from __future__ import annotations

import errno
import hashlib
import socket

import structlog

from sandpod_lifecycle.network.nflogwire import (
    CMD_BIND,
    CMD_UNBIND,
    NETLINK_NETFILTER,
    config_message,
    error_of,
)

__all__ = ["NflogSocket", "NflogUnavailable", "preferred_group"]

log = structlog.get_logger("sandpod.lifecycle.network")

GROUP_BASE, GROUP_SPAN = 0x6000, 0x2000  # derived groups: 24576 .. 32767
ATTEMPTS = 64
COPY_RANGE = 128
RCVBUF = 256 * 1024
MAX_DATAGRAM = 64 * 1024
ACK_TIMEOUT = 2.0
TAKEN = {errno.EPERM, errno.EBUSY}  # another socket holds the group


class NflogUnavailable(Exception):
    """No NFLOG group could be bound (no nfnetlink_log, no CAP_NET_ADMIN, all taken)."""

    code = "network.nflog_unavailable"
    retryable = False


def preferred_group(installation_id: str) -> int:
    """Where an installation starts looking for its group: spread over ``GROUP_SPAN``
    numbers, so two installations rarely even try the same one."""
    digest = hashlib.sha256(installation_id.encode()).digest()
    return GROUP_BASE + int.from_bytes(digest[:4], "big") % GROUP_SPAN


class NflogSocket:
    """One bound NFLOG group (see the module docstring). Non-blocking once bound."""

    def __init__(self, sock: socket.socket, group: int) -> None:
        self._sock: socket.socket | None = sock
        self.group = group

    @classmethod
    def bind(
        cls,
        preferred: int,
        *,
        attempts: int = ATTEMPTS,
        copy_range: int = COPY_RANGE,
        rcvbuf: int = RCVBUF,
    ) -> NflogSocket:
        """Bind the first free group of ``preferred``, ``preferred + 1``, ... (``attempts``
        numbers, wrapping inside 0..65535).

        Raises:
            NflogUnavailable: none could be bound, or netlink is not there at all.
        """
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        except OSError as exc:
            raise NflogUnavailable(f"no netfilter netlink socket: {exc}") from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.bind((0, 0))
            sock.settimeout(ACK_TIMEOUT)
            for attempt in range(attempts):
                group = (preferred + attempt) % 0x10000
                error = _request(sock, group, attempt * 2 + 1, command=CMD_BIND)
                if error in TAKEN:
                    continue
                if error == 0:
                    seq = attempt * 2 + 2
                    error = _request(sock, group, seq, copy_range=copy_range, qthreshold=1)
                if error != 0:
                    raise NflogUnavailable(f"NFLOG group {group}: {errno.errorcode.get(error)}")
                sock.setblocking(False)
                return cls(sock, group)
        except OSError as exc:
            sock.close()
            raise NflogUnavailable(f"NFLOG: {exc}") from exc
        except NflogUnavailable:
            sock.close()
            raise
        sock.close()
        raise NflogUnavailable(
            f"NFLOG groups {preferred}..{preferred + attempts - 1} all taken (or no CAP_NET_ADMIN)"
        )

    def fileno(self) -> int:
        return -1 if self._sock is None else self._sock.fileno()

    def recv(self) -> bytes:
        """One datagram (non-blocking).

        Raises:
            BlockingIOError: nothing to read now.
            OSError: ``ENOBUFS`` (log messages were lost: read on), or the socket is closed.
        """
        if self._sock is None:
            raise OSError(errno.EBADF, "the NFLOG socket is closed")
        return self._sock.recv(MAX_DATAGRAM)

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        """Unbind the group and close the socket (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:  # not waiting for the ack: the close ends the group anyway
            sock.send(config_message(self.group, 0, command=CMD_UNBIND))
        except OSError as exc:
            log.info("nflog_unbind_failed", group=self.group, error=str(exc))
        sock.close()


def _request(sock: socket.socket, group: int, seq: int, **config: int) -> int:
    """Send one config request (``config_message``'s keywords); its errno (0: acknowledged).
    Log datagrams arriving meanwhile are skipped (at bind time only: the first moment's)."""
    sock.send(config_message(group, seq, **config))
    while True:
        error = error_of(sock.recv(MAX_DATAGRAM), seq)
        if error is not None:
            return error
