"""The hand-written inputs of ``schemagen``: value rules, examples and payloads to reject.

Everything else in ``schemas/`` is derived from the binding; these tables hold what cannot be:
the value rules the messages' ``__post_init__`` enforce (as JSON Schema keywords; a rule naming a
field that does not exist fails generation), one realistic instance per message shape, payloads a
decoder must accept although they are not canonical, payloads it must reject, and one error per
code. ``S604`` is ignored on examples: ``shell`` there is a wire field, not a subprocess call.
"""

from __future__ import annotations

from typing import Any

import msgpack

from sandpod_contract import errors
from sandpod_contract._patterns import NO_NUL as _NO_NUL
from sandpod_contract._patterns import SPACE, no_nul
from sandpod_contract.codec import Message, pack, to_map
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.exec import (
    ExecExit,
    ExecFetch,
    ExecRef,
    ExecRequest,
    ExecResult,
    ExecResume,
    ExecSignal,
    ExecStart,
    ExecStarted,
    ExecStatus,
    OutputChunk,
    OutputPart,
    StdinWrite,
    StreamAck,
)
from sandpod_contract.messages.system import (
    Activity,
    Configure,
    Configured,
    Freeze,
    FreezeState,
    Info,
    Pong,
    SandboxMetrics,
    SnapshotTake,
    SnapshotTaken,
)

__all__ = ["ACCEPT", "ERRORS", "ERROR_ACCEPT", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

# -- value rules enforced by __post_init__ (a rule naming a missing field fails generation) -------

# messages.common.check_deliver as a pattern: dot-separated non-empty tokens, none exactly "*" or
# ">", no NUL and no whitespace (str.isspace, spelled out in SPACE). Without lookahead (RE2 has
# none): a token starts with a character other than "*" and ">", or is "*"/">" plus at least one
# more character. The prefix rule stays in code.
_TOKEN = f"(?:[^.*>{SPACE}][^.{SPACE}]*|[*>][^.{SPACE}]+)"
_DELIVER: dict[str, Any] = {"minLength": 1, "pattern": f"^{_TOKEN}(?:\\.{_TOKEN})*$"}
_TEXT: dict[str, Any] = {"type": "string", "pattern": _NO_NUL}
_COMMAND: dict[str, dict[str, Any]] = {
    "argv": {"minItems": 1, "prefixItems": [{**_TEXT, "minLength": 1}], "items": _TEXT},
    "shell": {"pattern": _NO_NUL},
    "cwd": {"pattern": _NO_NUL},
    "env": {
        "propertyNames": {"minLength": 1, "pattern": no_nul("=")},
        "additionalProperties": _TEXT,
    },
    "timeout": {"exclusiveMinimum": 0},
}
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "exec.request": {**_COMMAND, "max_output": {"minimum": 0}},
    "exec.start": {
        **_COMMAND,
        "deliver": _DELIVER,
        "window": {"minimum": 1},
        "abandon_after": {"exclusiveMinimum": 0},
    },
    "exec.fetch": {"offset": {"minimum": 0}, "max_bytes": {"minimum": 1}},
    "exec.signal": {"signal": {"minimum": 1, "maximum": 64}},
    "exec.resume": {"from_seq": {"minimum": 1}, "deliver": _DELIVER},
}
_ONE_COMMAND: dict[str, Any] = {"oneOf": [{"required": ["argv"]}, {"required": ["shell"]}]}
MESSAGE_RULES = {"exec.request": _ONE_COMMAND, "exec.start": _ONE_COMMAND}

# -- examples: realistic instances, "full" first (every field set), then variants and "minimal" ---

_ID = "8c1f0e5a2b3d4c6e9f7a1b2c3d4e5f60"
_INBOX = "_INBOX.Qm9kX2y7Lh3Tz1Wb8Vc4Nf"
_MiB = 1024 * 1024
EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "empty": [("basic", Empty())],
    "sys.pong": [("basic", Pong(sandbox_id="demo", time=1732900000.25))],
    "sys.info": [
        (
            "full",
            Info(
                sandbox_id="demo",
                execd_version="0.1.0",
                protocol_version=1,
                runtime="process",
                isolation="none",
                hostname="worker-1",
                pid=4242,
                started_at=1732899000.5,
                workspace="/workspace",
                max_request_bytes=_MiB,
                max_payload=_MiB,
                default_window=4 * _MiB,
                max_window=16 * _MiB,
                default_max_output=16 * _MiB,
                families=("exec", "sys"),
                max_output_limit=64 * _MiB,
            ),
        ),
        (
            "minimal",
            Info(
                sandbox_id="demo",
                execd_version="0.0.9",
                protocol_version=1,
                runtime="process",
                isolation="none",
                hostname="worker-1",
                pid=7,
                started_at=1732899000.0,
                workspace="/workspace",
                max_request_bytes=_MiB,
                max_payload=_MiB,
                default_window=4 * _MiB,
                max_window=16 * _MiB,
                default_max_output=16 * _MiB,
            ),
        ),
    ],
    "sys.metrics": [
        (
            "basic",
            SandboxMetrics(
                sandbox_id="demo",
                time=1732900000.25,
                source="procfs",
                cpu_seconds=12.75,
                cpu_count=2,
                load1=0.42,
                load5=0.3,
                load15=0.25,
                memory_rss=48 * _MiB,
                memory_total=24 * 1024 * _MiB,
                memory_available=20 * 1024 * _MiB,
                disk_used=3 * _MiB,
                disk_entries=214,
                disk_complete=True,
                disk_free=40 * 1024 * _MiB,
                disk_total=100 * 1024 * _MiB,
                processes=3,
                execs=1,
            ),
        ),
    ],
    "sys.activity": [
        (
            "basic",
            Activity(sandbox_id="demo", last_activity=1732899990.0, idle=10.25, time=1732900000.25),
        ),
    ],
    "sys.configure": [
        (
            "claim-env",
            Configure(
                env={"AGENT_ID": "a-17", "OPENAI_BASE_URL": "http://proxy:8080"}, generation=2
            ),
        ),
        ("minimal", Configure()),
    ],
    "sys.configured": [
        (
            "basic",
            Configured(sandbox_id="demo", generation=2, env_keys=("AGENT_ID", "OPENAI_BASE_URL")),
        ),
    ],
    "sys.freeze": [
        ("basic", Freeze(timeout=5.0)),
        ("minimal", Freeze()),
    ],
    "sys.freeze_state": [
        (
            "signals",
            FreezeState(
                sandbox_id="demo",
                frozen=True,
                mechanism="signals",
                processes=3,
                detail="SIGSTOP: the processes can observe it",
            ),
        ),
        ("thawed", FreezeState(sandbox_id="demo", frozen=False, mechanism="cgroup", processes=3)),
        ("minimal", FreezeState(sandbox_id="demo", frozen=False)),
    ],
    "sys.snapshot": [
        ("basic", SnapshotTake(path="/workspace", timeout=5.0)),
        ("minimal", SnapshotTake()),
    ],
    "sys.snapshot_taken": [
        (
            "basic",
            SnapshotTaken(
                sandbox_id="demo",
                file="/var/lib/sandpod/snapshots/1f2e.tar",
                size=10240,
                entries=3,
                mechanism="signals",
            ),
        ),
        (
            "minimal",
            SnapshotTaken(sandbox_id="demo", file="/var/lib/sandpod/s.tar", size=0, entries=0),
        ),
    ],
    "exec.request": [
        (
            "full",
            ExecRequest(
                exec_id=_ID,
                argv=("python3", "-c", "print(input().upper())"),
                cwd="/workspace/src",
                env={"LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"},
                stdin=b"hello\n",
                timeout=30.0,
                max_output=_MiB,
            ),
        ),
        ("shell", ExecRequest(exec_id=_ID, shell="make test 2>&1 | tail -n 20", timeout=600.0)),  # noqa: S604
        ("minimal", ExecRequest(argv=("true",))),
    ],
    "exec.result": [
        (
            "full",
            ExecResult(
                exec_id=_ID,
                exit_code=0,
                stdout=b"HELLO\n",
                stderr=b"warn\n",
                stdout_size=6,
                stderr_size=5,
                duration=0.042,
            ),
        ),
        (
            "timed-out",
            ExecResult(
                exec_id=_ID,
                signal=9,
                stdout=b"step 1\n",
                stdout_size=7,
                timed_out=True,
                duration=30.001,
            ),
        ),
        (
            "needs-fetch",
            ExecResult(
                exec_id=_ID,
                exit_code=0,
                stdout=b"\x00\x01\xfe\xff",
                stdout_size=3 * _MiB,
                duration=1.5,
            ),
        ),
        (
            "truncated",
            ExecResult(
                exec_id=_ID,
                exit_code=0,
                stdout=b"y\n" * 4,
                stdout_size=8,
                stdout_truncated=True,
                duration=2.0,
            ),
        ),
        ("minimal", ExecResult(exec_id=_ID, exit_code=0)),
    ],
    "exec.fetch": [
        ("full", ExecFetch(exec_id=_ID, stream="stdout", offset=4, max_bytes=_MiB - 1024)),
        ("minimal", ExecFetch(exec_id=_ID, stream="stderr", offset=0)),
    ],
    "exec.output_part": [
        ("basic", OutputPart(exec_id=_ID, stream="stdout", offset=4, data=b"\xfe\xff\n", eof=True)),
    ],
    "exec.start": [
        (
            "full",
            ExecStart(
                deliver=_INBOX,
                exec_id=_ID,
                argv=("python3", "-i"),
                cwd="/workspace",
                env={"TERM": "dumb"},
                stdin=b"import sys\n",
                stdin_open=True,
                timeout=3600.0,
                window=_MiB,
                abandon_after=30.0,
            ),
        ),
        ("shell", ExecStart(deliver=_INBOX, exec_id=_ID, shell="tail -f /var/log/app.log")),  # noqa: S604
        ("minimal", ExecStart(deliver=_INBOX, argv=("ls", "-l"))),
    ],
    "exec.started": [
        ("full", ExecStarted(exec_id=_ID, pid=31337, window=4 * _MiB, abandon_after=60.0)),
        ("minimal", ExecStarted(exec_id=_ID, pid=31337, window=4 * _MiB)),
    ],
    "exec.ack": [
        ("basic", StreamAck(exec_id=_ID, seq=17)),
        ("keepalive", StreamAck(exec_id=_ID, seq=0)),
    ],
    "exec.stdin": [
        ("full", StdinWrite(exec_id=_ID, data=b"print(1)\n", eof=True)),
        ("data", StdinWrite(exec_id=_ID, data=b"\x04binary\x00")),
        ("minimal", StdinWrite(exec_id=_ID, eof=True)),
    ],
    "exec.signal": [("sigterm", ExecSignal(exec_id=_ID, signal=15))],
    "exec.ref": [("basic", ExecRef(exec_id=_ID))],
    "exec.resume": [
        ("full", ExecResume(exec_id=_ID, from_seq=18, deliver=_INBOX)),
        ("minimal", ExecResume(exec_id=_ID, from_seq=1)),
    ],
    "exec.status": [
        ("stream", ExecStatus(exec_id=_ID, state="running", pid=31337, next_seq=42, acked_seq=40)),
        ("minimal", ExecStatus(exec_id=_ID, state="exited")),
    ],
    "exec.chunk": [
        ("stdout", OutputChunk(exec_id=_ID, seq=1, stream="stdout", data=b"line 1\n")),
        ("stderr", OutputChunk(exec_id=_ID, seq=2, stream="stderr", data=b"\x1b[31merr\x1b[0m\n")),
    ],
    "exec.exit": [
        (
            "full",
            ExecExit(
                exec_id=_ID, seq=42, exit_code=0, duration=12.5, stdout_size=1048576, stderr_size=12
            ),
        ),
        ("cancelled", ExecExit(exec_id=_ID, seq=3, signal=9, cancelled=True, duration=0.5)),
        ("abandoned", ExecExit(exec_id=_ID, seq=9, signal=9, abandoned=True, duration=60.0)),
        ("minimal", ExecExit(exec_id=_ID, seq=1)),
    ],
}

_REQ = to_map(EXAMPLES["exec.request"][0][1])
# Hand-made bytes where ``pack`` cannot say it: a repeated key, a float 32.
_DUPLICATE_KEY = (
    b"\x83" + pack("v") + pack(1) + pack("exec_id") + pack("old") + pack("exec_id") + pack(_ID)
)
_FLOAT32 = b"\x83" + pack("v") + pack(1) + pack("shell") + pack("ls") + pack("timeout")
_FLOAT32 += b"\xca\x41\xf0\x00\x00"  # 30.0 as float 32
ACCEPT: list[tuple[str, type[Message], dict[str, Any] | bytes, str]] = [
    (
        "unknown-fields",
        ExecRequest,
        {**_REQ, "priority": 5, "x_new": {"a": [1, b"\x00"]}},
        "unknown fields are ignored (and dropped on re-encoding)",
    ),
    ("int-for-float", ExecRequest, {**_REQ, "timeout": 30}, "an int is accepted for a float"),
    ("nil-is-absent", ExecRequest, {**_REQ, "cwd": None}, "nil on a non-required field = absent"),
    (
        "any-key-order",
        ExecStatus,
        dict(reversed(to_map(EXAMPLES["exec.status"][0][1]).items())),
        "keys may come in any order ('v' too)",
    ),
    (
        "duplicate-key",
        ExecRef,
        _DUPLICATE_KEY,
        "a key repeated in one map: the last value wins (as every msgpack map decoder does)",
    ),
    (
        "float32",
        ExecRequest,
        _FLOAT32,
        "a float 32 is accepted for a number (widened); encoders write float 64",
    ),
]

_REF = {"v": 1, "exec_id": _ID}
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    # (label, type, payload, error code, a JSON Schema validator catches it too, why). The JSON
    # view cannot tell str from bin, nor 1.0 from 1 (JSON Schema counts 1.0 as an integer).
    ("empty-payload", Empty, b"", "bad_request", False, "even an empty request is {'v': 1}"),
    ("garbage", ExecRef, b"\xc1", "bad_request", False, "0xc1 is never valid msgpack"),
    ("truncated", ExecRef, pack(_REF)[:-3], "bad_request", False, "msgpack cut short"),
    ("trailing-bytes", ExecRef, pack(_REF) + b"\x00", "bad_request", False, "data after the map"),
    ("not-a-map", ExecRef, pack([1, _ID]), "bad_request", True, "a message is always a map"),
    ("int-key", ExecRef, pack({**_REF, 1: 2}), "bad_request", False, "map keys are strings"),
    ("missing-v", ExecRef, pack({"exec_id": _ID}), "bad_request", True, "'v' is required"),
    ("missing-field", ExecRef, pack({"v": 1}), "bad_request", True, "exec_id is required"),
    (
        "version-too-new",
        ExecRef,
        pack({**_REF, "v": 2}),
        "bad_request.unsupported_version",
        True,
        "v newer than the receiver knows",
    ),
    ("wrong-type", ExecRef, pack({"v": 1, "exec_id": 42}), "bad_request", True, "int for str"),
    (
        "bin-for-str",
        ExecRef,
        pack({"v": 1, "exec_id": _ID.encode()}),
        "bad_request",
        False,
        "text is msgpack str, never bin",
    ),
    (
        "str-for-bin",
        StdinWrite,
        pack({**_REF, "data": "hi"}),
        "bad_request",
        False,
        "bytes are msgpack bin, never str (nor base64)",
    ),
    (
        "bool-for-int",
        StreamAck,
        pack({**_REF, "seq": True}),
        "bad_request",
        True,
        "a bool is not an int",
    ),
    (
        "float-for-int",
        StreamAck,
        pack({**_REF, "seq": 1.0}),
        "bad_request",
        False,
        "a float is not an int",
    ),
    (
        "bad-enum",
        ExecFetch,
        pack({**_REF, "stream": "stdin", "offset": 0}),
        "bad_request",
        True,
        "stream is stdout or stderr",
    ),
    (
        "argv-and-shell",
        ExecRequest,
        pack({"v": 1, "argv": ["ls"], "shell": "ls"}),
        "bad_request",
        True,
        "exactly one of argv or shell",
    ),
    (
        "no-command",
        ExecRequest,
        pack({"v": 1, "cwd": "/workspace"}),
        "bad_request",
        True,
        "exactly one of argv or shell",
    ),
    (
        "empty-argv",
        ExecRequest,
        pack({"v": 1, "argv": []}),
        "bad_request",
        True,
        "argv needs a program",
    ),
    (
        "nul-in-argv",
        ExecRequest,
        pack({"v": 1, "argv": ["ls", "a\x00b"]}),
        "bad_request",
        True,
        "no NUL in argv, env, cwd, shell",
    ),
    (
        "bad-env-name",
        ExecRequest,
        pack({"v": 1, "shell": "env", "env": {"A=B": "1"}}),
        "bad_request",
        True,
        "env names have no '=' or NUL",
    ),
    (
        "zero-timeout",
        ExecRequest,
        pack({"v": 1, "shell": "ls", "timeout": 0.0}),
        "bad_request",
        True,
        "timeout > 0",
    ),
    (
        "str-list-for-array",
        ExecRequest,
        pack({"v": 1, "argv": "ls -l"}),
        "bad_request",
        True,
        "argv is an array",
    ),
    (
        "empty-deliver",
        ExecStart,
        pack({"v": 1, "deliver": "", "shell": "ls"}),
        "bad_request",
        True,
        "deliver must be a subject",
    ),
    (
        "wildcard-deliver",
        ExecStart,
        pack({"v": 1, "deliver": "_INBOX.*", "shell": "ls"}),
        "bad_request",
        True,
        "deliver is one concrete subject: no '*' or '>' token",
    ),
    (
        "empty-token-deliver",
        ExecResume,
        pack({**_REF, "from_seq": 1, "deliver": "_INBOX..x"}),
        "bad_request",
        True,
        "deliver has no empty token",
    ),
    (
        "space-in-deliver",
        ExecStart,
        pack({"v": 1, "deliver": "_INBOX.a\u2003b", "shell": "ls"}),
        "bad_request",
        True,
        "deliver has no whitespace (any Unicode space)",
    ),
    ("bad-signal", ExecSignal, pack({**_REF, "signal": 0}), "bad_request", True, "signal 1..64"),
    (
        "resume-from-zero",
        ExecResume,
        pack({**_REF, "from_seq": 0}),
        "bad_request",
        True,
        "seq starts at 1",
    ),
    (
        "ext-type",
        ExecRef,
        pack({**_REF, "x_new": msgpack.ExtType(5, b"\x01")}),
        "bad_request",
        False,
        "msgpack ext values are never sent and refused anywhere, even in an unknown field",
    ),
    (
        "timestamp-ext",
        ExecRef,
        pack({**_REF, "x_new": msgpack.Timestamp(1732900000, 0)}),
        "bad_request",
        False,
        "the timestamp ext (-1) is an ext value too",
    ),
    (
        "invalid-utf8",
        ExecRef,
        b"\x82" + pack("v") + pack(1) + pack("exec_id") + b"\xa2\xff\xfe",
        "bad_request",
        False,
        "a msgpack str must be valid UTF-8",
    ),
    (
        "nil-in-env",
        ExecRequest,
        pack({"v": 1, "shell": "env", "env": {"A": None}}),
        "bad_request",
        True,
        "a typed map's values have its type: nil is not a str (free maps such as details keep nil)",
    ),
    (
        "missing-kind",
        OutputChunk,
        pack({**_REF, "seq": 1, "stream": "stdout", "data": b""}),
        "bad_request",
        True,
        "kind is the frame discriminator: a frame without it cannot be typed",
    ),
    (
        "wrong-kind",
        OutputChunk,
        pack({**_REF, "kind": "exit", "seq": 1, "stream": "stdout", "data": b""}),
        "bad_request",
        True,
        "kind tells the frame types apart",
    ),
]

ERRORS: list[errors.SandpodError] = [
    errors.InternalError("RuntimeError in exec.run"),
    errors.BadRequest("exec.request: exactly one of 'argv' or 'shell' is required"),
    errors.PayloadTooLarge("request of 2097152 bytes exceeds 1048576", size=2097152, limit=_MiB),
    errors.UnsupportedVersion(
        "exec.ref: version 2 is newer than supported 1", type="exec.ref", version=2, supported=1
    ),
    errors.UnknownSubject(
        "no operation exec.frobnicate; see schemas/README.md",
        subject="sandpod.sbx.demo.exec.frobnicate",
    ),
    errors.ConnectionLost("NATS connection is closed"),
    errors.RequestTimeout(
        "no reply on sandpod.sbx.demo.exec.status within 5s",
        subject="sandpod.sbx.demo.exec.status",
        timeout=5.0,
    ),
    errors.Busy("1024 execs running (limit 1024)", limit=1024),
    errors.SandboxError(),
    errors.SandboxNotFound("sandpod.sbx.gone.exec.run is not served here"),
    errors.SandboxUnavailable("execd stopped answering during exec " + _ID),
    errors.SandboxPaused("sandbox demo is paused: resume it to start commands"),
    errors.SandboxJailRefused(
        "sandbox 'evil': refusing jail file /var/lib/sandpod/jails/evil/"
        "jail.json: no jail (No such file or directory)",
        sandbox_id="evil",
        reason="no jail",
    ),
    errors.ExecError(),
    errors.ExecNotFound(f"no streaming exec {_ID!r} in this execd", exec_id=_ID),
    errors.ExecLost(f"exec {_ID} finished but its reply never arrived"),
    errors.SpawnFailed(
        "cannot start './build.sh': Permission denied", program="./build.sh", errno=13
    ),
    errors.CommandNotFound("'pytohn': command not found", program="pytohn"),
    errors.InvalidCwd("working directory '/workspace/nope' does not exist", cwd="/workspace/nope"),
    errors.ExecIdInUse("exec id 'c0ffee' is in use; choose a fresh one", exec_id="c0ffee"),
    errors.StreamClosed("stdin is closed (already at EOF, or never opened)"),
    errors.StoreError("KV bucket sandpod-resources unavailable"),
    errors.ResourceNotFound("Sandbox default/demo not found", kind="Sandbox", name="demo"),
    errors.ResourceExists("Sandbox default/demo exists", kind="Sandbox", name="demo"),
    errors.ResourceConflict(
        "Sandbox default/demo changed (resourceVersion 7, not 5)", kind="Sandbox", name="demo"
    ),
    errors.ResourceInvalid("spec.idleTimeoutSeconds must be >= 0", field="spec.idleTimeoutSeconds"),
    errors.ResourceExpired("watch of Sandbox: too old resource version: 5 (812)", kind="Sandbox"),
    errors.VolumeInUse(
        "SandboxVolume 'data' is mounted by sbx-a: cannot mount it read-write",
        name="data",
        holders="sbx-a",
    ),
    errors.VolumeQuotaExceeded(
        "tenant 'acme' would hold 120Gi of volumes, over its quota of 100Gi",
        quota="volume_bytes",
        limit=107374182400,
        setting="SANDPOD_VOLUME_MAX_BYTES",
    ),
    errors.InsufficientStorage(
        "JetStream cannot reserve 256 MiB for stream sandpod-events: ...",
        stream="sandpod-events",
        reserve_bytes=268435456,
        account_reserved_bytes=0,
        account_stored_bytes=0,
        account_limit_bytes=-1,
        account_streams=2,
        setting="SANDPOD_EVENTS_MAX_BYTES",
    ),
    errors.ClaimError("claim default/c1 could not be served"),
    errors.PoolNotFound("no SandboxWarmPool 'python' in namespace 'default'", pool="python"),
    errors.ClaimTimeout(
        "claim default/c1 not ready within 30s (PoolExhausted: cold create)",
        claim="c1",
        reason="PoolExhausted",
    ),
    errors.ClaimFailed(
        "claim default/c1: sandbox failed: rootfs not found", claim="c1", reason="SandboxFailed"
    ),
    errors.ImageError("registry ghcr.io answered 503", reference="ghcr.io/o/r:1", status=503),
    errors.ImageNotFound("no image python:3.99 (manifest unknown)", reference="python:3.99"),
    errors.ImageAuthFailed("ghcr.io refused the credentials (401)", registry="ghcr.io", status=401),
    errors.ImageDigestMismatch(
        "blob sha256:aa... arrived as sha256:bb...; nothing was kept",
        expected="sha256:" + "a" * 64,
        actual="sha256:" + "b" * 64,
    ),
    errors.ImageUnsupported(
        "media type application/vnd.x is not a layer Sandpod unpacks",
        media_type="application/vnd.x",
    ),
    errors.ImageLayerRefused(
        "layer entry '../etc/passwd' escapes the layer", entry="../etc/passwd", reason="path_escape"
    ),
    errors.ImageInUse(
        "python:3.12-slim is used by 1 sandbox", reference="python:3.12-slim", holders=["sbx-1"]
    ),
    errors.SnapshotError("snapshot s1 could not be taken"),
    errors.SnapshotFailed(
        "snapshot s1 failed: the sandbox sbx-1 is not running", snapshot="s1", reason="NotRunning"
    ),
    errors.SnapshotInUse("snapshot s1 is restored by 1 sandbox", snapshot="s1", holders=["sbx-2"]),
    errors.SnapshotQuotaExceeded(
        "tenant acme has 20 snapshots, its quota", quota="count", limit=20, used=20
    ),
    errors.SnapshotUnsupported(
        "the kubernetes runtime does not take snapshots yet", runtime="kubernetes"
    ),
    errors.BlobError(
        "S3 answered 404 NoSuchBucket for snapshots/sha256:aa...",
        digest="sha256:" + "a" * 64,
        status=404,
        s3_code="NoSuchBucket",
    ),
    errors.BlobNotFound("no blob sha256:aa... in the store", digest="sha256:" + "a" * 64),
    errors.BlobCorrupt(
        "sha256:aa...: the stored bytes hash to sha256:bb... (1024 bytes)",
        digest="sha256:" + "a" * 64,
        actual="sha256:" + "b" * 64,
        size=1024,
    ),
    errors.BlobInvalidDigest(digest="../../etc/passwd"),
    errors.BlobAuthFailed("S3 answered 403 SignatureDoesNotMatch", status=403),
    errors.BlobUnavailable("S3 GET broke off mid-body: ReadError", digest="sha256:" + "a" * 64),
    errors.TemplateError("template data could not be built"),
    errors.BuildFailed(
        "step 2 (run pip install pandas) failed: the command exited with 1",
        template="data",
        step=2,
        instruction="run pip install pandas",
        exit_code=1,
        log_tail="ERROR: No matching distribution found for pandas",
    ),
    errors.BuildUnsupported(
        "Dockerfile line 7: HEALTHCHECK is not supported: outside the supported subset",
        what="HEALTHCHECK",
        line=7,
    ),
    errors.error_from_wire(
        {
            "code": "exec.quota_exceeded",
            "message": "CPU quota used up",
            "retryable": True,
            "details": {"quota": "cpu"},
        }
    ),
]


# Error envelopes as a peer may send them: (label, envelope, why).
ERROR_ACCEPT: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown-keys-and-nil-detail",
        {
            "v": 1,
            "error": {
                "code": "exec.not_found",
                "message": "no streaming exec",
                "retryable": False,
                "details": {"exec_id": _ID, "hint": None},
                "trace_id": "4bf92f3577b34da6",
            },
            "x_new": 1,
        },
        "unknown keys in the envelope and inside 'error' are ignored (dropped on re-encoding); "
        "a nil in details is a value and is kept",
    ),
    (
        "unknown-code-deep",
        {
            "v": 1,
            "error": {
                "code": "exec.spawn_failed.noexec_mount",
                "message": "the workspace is mounted noexec",
                "retryable": False,
                "details": {"program": "./run.sh"},
            },
        },
        "an unknown code maps to its longest known dot-prefix: exec.spawn_failed",
    ),
]


# -- the other families keep their inputs in _vectors_<family>.py ----------------------------------


def _merge() -> None:
    from sandpod_contract import (
        _vectors_api,
        _vectors_fs,
        _vectors_git,
        _vectors_proc,
        _vectors_pty,
        _vectors_session,
        _vectors_watch,
    )

    for fam in (
        _vectors_fs,
        _vectors_proc,
        _vectors_session,
        _vectors_pty,
        _vectors_watch,
        _vectors_git,
        _vectors_api,
    ):
        RULES.update(fam.RULES)
        MESSAGE_RULES.update(fam.MESSAGE_RULES)
        EXAMPLES.update(fam.EXAMPLES)
        ACCEPT.extend(fam.ACCEPT)
        REJECT.extend(fam.REJECT)
        ERRORS.extend(fam.ERRORS)


_merge()
