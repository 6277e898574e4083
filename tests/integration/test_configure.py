"""sys.configure: the default env of a sandbox's new commands (how a claim's env reaches a warm
sandbox), on a private execd."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest import Execd
from sandpod import AsyncSandbox
from sandpod.errors import BadRequest
from sandpod_contract.messages.system import Configure, Configured


async def _configure(sbx: AsyncSandbox, env: dict[str, str], generation: int) -> Configured:
    return await sbx.channel.call(
        "sys", "configure", Configure(env=env, generation=generation), Configured, 5.0
    )


async def test_configured_env_reaches_new_commands_and_stale_generations_are_ignored(
    start_execd: Callable[..., Execd],
) -> None:
    """Execs, sessions and processes started after configure see its env; a replacement set
    drops the old keys; a lower generation changes nothing; values are never echoed."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=execd.nats_url) as sbx:
        before = await sbx.activity()
        reply = await _configure(sbx, {"AGENT": "a1", "TOKEN": "s3cret"}, 2)
        assert (reply.generation, reply.env_keys) == (2, ("AGENT", "TOKEN"))
        assert "s3cret" not in repr(reply)
        assert (await sbx.activity()).last_activity > before.last_activity  # idle clock reset
        assert (await sbx.exec("echo $AGENT-$TOKEN")).stdout == "a1-s3cret\n"
        session = await sbx.sessions.create()
        assert (await session.run("echo $AGENT")).stdout == "a1\n"
        proc = await sbx.proc.start("echo $AGENT")
        await proc.wait(10)
        assert b"".join(c.data for c in (await proc.logs()).chunks) == b"a1\n"
        stale = await _configure(sbx, {"AGENT": "old"}, 1)
        assert (stale.generation, stale.env_keys) == (2, ())
        assert (await sbx.exec("echo $AGENT")).stdout == "a1\n"
        await _configure(sbx, {"OTHER": "x"}, 3)
        assert (await sbx.exec("echo ${AGENT:-unset} $OTHER")).stdout == "unset x\n"
        assert (await sbx.exec("echo $HOME")).stdout.strip()  # the template's env stays


async def test_configure_refuses_names_a_shell_cannot_set(
    start_execd: Callable[..., Execd],
) -> None:
    """A variable name that is not a shell name is bad_request, and nothing changes."""
    execd = start_execd()
    async with await AsyncSandbox.connect(execd.ids[0], nats_url=execd.nats_url) as sbx:
        with pytest.raises(BadRequest):
            await _configure(sbx, {"A B": "1", "OK": "2"}, 1)
        assert (await sbx.exec("echo ${OK:-unset}")).stdout == "unset\n"
