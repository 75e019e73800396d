"""An interactive worker's input through the process runtime (runtime/stdin_fifo.py -> the shim -> its stdin).

- a pipe: the bytes arrive in order, the end of input closes the worker's stdin;
- a worker that does not read takes only what its pipes hold, and says so (`taken`), never more;
- a pty: the worker's stdin is a terminal of the size sent, its output reaches the log;
- the input survives a new runtime object (an agent restart): the FIFO is the worker's, not the agent's;
- a worker that takes no input, or has ended, refuses it (InputClosed).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodeagent.runtime.process import ProcessRuntime
from nodeagent.runtime.stdin_fifo import InputClosed
from tests.agent.runtime_helpers import spec, wait_for_log


async def test_pipe_input_arrives_in_order_and_its_end_closes_stdin(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state", node_id="n1")
    h = await rt.start(spec(["sh", "-c", "echo ready; cksum; echo after-eof"], stdin="pipe"))
    await wait_for_log(rt, h, "ready")
    data = bytes(range(256)) * 1000  # 256 kB: many frames, the pipe full on the way
    sent = 0
    while sent < len(data):
        sent += await rt.send_input(h, data[sent:sent + 65536])
    assert await rt.send_input(h, b"", eof=True) == 0
    info = await asyncio.wait_for(rt.wait(h), 20)
    assert info.exit_code == 0, info.log_tail
    proc = await asyncio.create_subprocess_exec("cksum", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    expected, _ = await proc.communicate(data)
    assert expected.decode() in info.log_tail and "after-eof" in info.log_tail, info.log_tail


async def test_a_worker_that_does_not_read_takes_only_what_its_pipes_hold(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state", node_id="n1")
    h = await rt.start(spec(["sh", "-c", "echo ready; sleep 30"], stdin="pipe"))
    await wait_for_log(rt, h, "ready")
    taken, offered = 0, b"x" * 65536
    for _ in range(10):
        now = await rt.send_input(h, offered)
        taken += now
        if now < len(offered):
            break  # full: the worker reads nothing
    assert 0 < taken <= 512 * 1024, taken  # (two pipes of 64 kB and the relay's read, not all 640 kB offered)
    assert await rt.send_input(h, offered) == 0  # still full: nothing more is taken
    await rt.stop(h, 0.5)
    with pytest.raises(InputClosed):
        await rt.send_input(h, b"late")


async def test_pty_input_and_window_size(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state", node_id="n1")
    h = await rt.start(spec(["sh", "-c", "echo ready; read line; echo got-$line; stty size"], stdin="pty"))
    await wait_for_log(rt, h, "ready")
    assert await rt.send_input(h, b"abc\n", rows=21, cols=77) == 4
    info = await asyncio.wait_for(rt.wait(h), 20)
    assert info.exit_code == 0, info.log_tail
    assert "got-abc" in info.log_tail and "21 77" in info.log_tail, info.log_tail


async def test_input_survives_a_new_runtime_and_is_refused_without_a_fifo(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state", node_id="n1")
    h = await rt.start(spec(["cat"], stdin="pipe"))
    plain = await rt.start(spec(["sh", "-c", "echo ready; sleep 30"], rank=1))
    again = ProcessRuntime(tmp_path / "state", node_id="n1")  # as a restarted agent's
    assert await again.send_input(h, b"after restart\n", eof=True) == len(b"after restart\n")
    info = await asyncio.wait_for(again.wait(h), 20)
    assert "after restart" in info.log_tail
    await wait_for_log(rt, plain, "ready")
    with pytest.raises(InputClosed):
        await rt.send_input(plain, b"nobody reads this")
    await rt.stop(plain, 0.5)
