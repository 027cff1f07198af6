"""@agentkv.tool and agentkv.tool_call on every kind of callable."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Iterator

import pytest

import agentkv
from agentkv.testing import capture_events


@agentkv.tool
def plain(a: int, b: str = "x") -> str:
    """Plain tool."""
    return f"{a}{b}"


@agentkv.tool(tool_class="shell", name="run_shell")
async def shell(cmd: str) -> str:
    await asyncio.sleep(0)
    return cmd[::-1]


@agentkv.tool(tool_class="stream")
def chunks(n: int) -> Iterator[int]:
    total = yield 0
    for i in range(1, n):
        total = yield i
    return total


@agentkv.tool(tool_class="astream")
async def achunks(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


class Toolbox:
    factor = 3

    @agentkv.tool(tool_class="math")
    def times(self, x: int) -> int:
        return x * self.factor


def test_signature_docstring_and_annotations_are_kept() -> None:
    assert plain.__name__ == "plain" and plain.__doc__ == "Plain tool."
    assert inspect.signature(plain) == inspect.signature(plain.__wrapped__)  # type: ignore[attr-defined]
    assert plain.__annotations__ == {"a": "int", "b": "str", "return": "str"}
    assert inspect.iscoroutinefunction(shell)
    assert inspect.isgeneratorfunction(chunks)
    assert inspect.isasyncgenfunction(achunks)


def test_outside_a_trajectory_tools_run_and_emit_nothing() -> None:
    with capture_events() as events:
        assert plain(1) == "1x"
        assert asyncio.run(shell("ab")) == "ba"
        assert list(chunks(3)) == [0, 1, 2]
    assert events == []


def test_sync_tool_emits_started_and_finished_with_duration() -> None:
    with capture_events() as events, agentkv.trajectory("t"):
        assert plain(2, b="y") == "2y"
    started, finished, _end = events
    assert (started.event, finished.event) == ("tool_started", "tool_finished")
    assert started.tool_class == "plain" and started.tool_name == "plain"
    assert finished.status == "ok" and finished.duration_ms is not None
    assert finished.duration_ms >= 0


def test_async_tool_uses_given_class_and_name() -> None:
    async def go() -> str:
        async with agentkv.trajectory("t"):
            return await shell("abc")

    with capture_events() as events:
        assert asyncio.run(go()) == "cba"
    assert events[0].tool_class == "shell" and events[0].tool_name == "run_shell"


def test_generator_tool_spans_the_iteration_and_forwards_send() -> None:
    with capture_events() as events, agentkv.trajectory("t"):
        gen = chunks(3)
        assert next(gen) == 0
        assert [e.event for e in events] == ["tool_started"]
        assert gen.send(10) == 1
        assert gen.send(20) == 2
        with pytest.raises(StopIteration) as stop:
            gen.send(30)
        assert stop.value.value == 30
    assert [e.event for e in events] == ["tool_started", "tool_finished", "trajectory_finished"]
    assert events[1].status == "ok"


def test_async_generator_tool() -> None:
    async def go() -> list[int]:
        async with agentkv.trajectory("t"):
            return [i async for i in achunks(3)]

    with capture_events() as events:
        assert asyncio.run(go()) == [0, 1, 2]
    assert [e.event for e in events][:2] == ["tool_started", "tool_finished"]


def test_method_tool_sees_self() -> None:
    with capture_events() as events, agentkv.trajectory("t"):
        assert Toolbox().times(2) == 6
    assert events[0].tool_class == "math"


def test_exceptions_pass_through_untouched_and_are_recorded() -> None:
    err = ValueError("bad input")

    @agentkv.tool
    def broken() -> None:
        raise err

    with capture_events() as events, agentkv.trajectory("t"), pytest.raises(ValueError) as info:
        broken()
    assert info.value is err
    assert events[1].event == "tool_finished" and events[1].status == "error"


async def test_cancelled_tool_is_recorded_as_cancelled() -> None:
    gate = asyncio.Event()

    @agentkv.tool(tool_class="slow")
    async def slow() -> None:
        gate.set()
        await asyncio.sleep(10)

    with capture_events() as events:
        async with agentkv.trajectory("t"):
            task = asyncio.create_task(slow())
            await gate.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finished = [e for e in events if e.event == "tool_finished"]
    assert finished[0].status == "cancelled"


def test_tool_call_context_manager_sync_and_async() -> None:
    async def go() -> None:
        async with agentkv.tool_call("browser", name="open_page"):
            await asyncio.sleep(0)

    with capture_events() as events, agentkv.trajectory("t"):
        with agentkv.tool_call("shell"):
            pass
        asyncio.run(go())
    classes = [(e.event, e.tool_class, e.tool_name) for e in events if e.event.startswith("tool")]
    assert classes == [
        ("tool_started", "shell", "shell"),
        ("tool_finished", "shell", "shell"),
        ("tool_started", "browser", "open_page"),
        ("tool_finished", "browser", "open_page"),
    ]


def test_bad_decorator_arguments_raise_at_setup() -> None:
    with pytest.raises(agentkv.ConfigError):
        agentkv.tool(tool_class="")
    with pytest.raises(agentkv.ConfigError):
        agentkv.tool_call("")
    with pytest.raises(TypeError):
        agentkv.tool(42)  # type: ignore[call-overload]
