"""Trajectory context: scopes, nesting, turns, outcomes, threads and tasks."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

import agentkv
from agentkv.testing import capture_events


def kinds(events: list[agentkv.TrajectoryEvent]) -> list[str]:
    return [e.event for e in events]


def test_current_trajectory_is_none_outside_and_set_inside() -> None:
    assert agentkv.current_trajectory() is None
    with agentkv.trajectory("t-1", tenant="acme") as traj:
        assert agentkv.current_trajectory() is traj
        assert traj.trajectory_id == "t-1" and traj.tenant == "acme"
    assert agentkv.current_trajectory() is None


def test_normal_exit_emits_trajectory_finished_ok() -> None:
    with capture_events() as events, agentkv.trajectory("t"):
        pass
    assert kinds(events) == ["trajectory_finished"]
    assert events[0].status == "ok"


def test_exception_emits_finished_with_error_and_propagates_unchanged() -> None:
    class Boom(Exception):
        pass

    err = Boom("x")
    with capture_events() as events, pytest.raises(Boom) as info, agentkv.trajectory("t"):
        raise err
    assert info.value is err
    assert events[-1].event == "trajectory_finished" and events[-1].status == "error"


def test_keyboard_interrupt_emits_cancelled_and_propagates() -> None:
    with (
        capture_events() as events,
        pytest.raises(KeyboardInterrupt),
        agentkv.trajectory("t"),
    ):
        raise KeyboardInterrupt
    assert events[-1].event == "trajectory_cancelled"


async def test_async_with_and_task_cancellation_emits_cancelled() -> None:
    started = asyncio.Event()

    async def loop() -> None:
        async with agentkv.trajectory("t-async"):
            started.set()
            await asyncio.sleep(10)

    with capture_events() as events:
        task = asyncio.create_task(loop())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert kinds(events) == ["trajectory_cancelled"]
    assert events[0].trajectory_id == "t-async"


def test_nested_trajectory_is_a_subagent_with_parent_recorded() -> None:
    with capture_events() as events, agentkv.trajectory("parent", tenant="acme") as parent:
        with agentkv.trajectory("child") as child:
            assert child.parent is parent and child.parent_id == "parent"
            assert child.tenant == "acme"  # inherited
        assert agentkv.current_trajectory() is parent
    child_end = events[0]
    assert child_end.trajectory_id == "child" and child_end.parent_trajectory_id == "parent"


def test_explicit_none_parent_makes_a_root() -> None:
    with agentkv.trajectory("a"), agentkv.trajectory("b", parent=None) as b:
        assert b.parent_id is None


def test_turn_ids_advance_per_model_call_and_idle_gap_is_measured() -> None:
    @agentkv.tool(tool_class="shell")
    def run() -> None:
        pass

    with capture_events() as events, agentkv.trajectory("t"):
        for _ in range(3):
            with agentkv.model_call() as call:
                assert call is not None
            run()
    started = [e for e in events if e.event == "model_started"]
    assert [e.turn_id for e in started] == [0, 1, 2]
    assert started[0].idle_gap_ms is None
    assert started[1].idle_gap_ms is not None and started[1].idle_gap_ms >= 0
    assert started[1].after_tool_class == "shell"
    tool_events = [e for e in events if e.event == "tool_started"]
    assert [e.turn_id for e in tool_events] == [0, 1, 2]


def test_model_call_outside_trajectory_is_a_no_op() -> None:
    with capture_events() as events, agentkv.model_call() as call:
        assert call is None
    assert events == []


def test_agent_decorator_opens_a_trajectory_per_call() -> None:
    @agentkv.agent
    def loop(x: int) -> int:
        """Doc."""
        assert agentkv.current_trajectory() is not None
        return x + 1

    @agentkv.agent(name="planner", tenant="t1")
    async def aloop() -> str:
        traj = agentkv.current_trajectory()
        assert traj is not None
        return str(traj.tenant)

    with capture_events() as events:
        assert loop(1) == 2
        assert loop(2) == 3
        assert asyncio.run(aloop()) == "t1"
    assert kinds(events) == ["trajectory_finished"] * 3
    assert len({e.trajectory_id for e in events}) == 3
    assert loop.__doc__ == "Doc." and loop.__name__ == "loop"


def test_agent_decorator_on_generators() -> None:
    @agentkv.agent
    def steps() -> object:
        yield agentkv.current_trajectory() is not None
        yield 2

    @agentkv.agent
    async def asteps() -> object:
        yield agentkv.current_trajectory() is not None

    async def collect() -> list[object]:
        return [x async for x in asteps()]

    with capture_events() as events:
        assert list(steps()) == [True, 2]
        assert asyncio.run(collect()) == [True]
    assert kinds(events) == ["trajectory_finished", "trajectory_finished"]


def test_bind_context_carries_the_trajectory_into_a_thread_pool() -> None:
    def where() -> str | None:
        traj = agentkv.current_trajectory()
        return traj.trajectory_id if traj else None

    with agentkv.trajectory("t-threads"), concurrent.futures.ThreadPoolExecutor(2) as pool:
        plain = pool.submit(where).result()
        bound = [f.result() for f in [pool.submit(agentkv.bind_context(where)) for _ in range(4)]]
    assert plain is None
    assert bound == ["t-threads"] * 4


async def test_run_in_executor_with_bind_context_and_tasks_inherit() -> None:
    def where() -> str | None:
        traj = agentkv.current_trajectory()
        return traj.trajectory_id if traj else None

    async def in_task() -> str | None:
        return where()

    async with agentkv.trajectory("t-loop"):
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, agentkv.bind_context(where)) == "t-loop"
        assert await asyncio.create_task(in_task()) == "t-loop"


def test_parallel_tool_calls_in_threads_share_one_trajectory() -> None:
    @agentkv.tool(tool_class="search")
    def search(i: int) -> int:
        return i * 2

    with capture_events() as events, agentkv.trajectory("par"):
        with agentkv.model_call():
            pass
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(agentkv.bind_context(search), range(8)))
    assert results == [i * 2 for i in range(8)]
    finished = [e for e in events if e.event == "tool_finished"]
    assert len(finished) == 8 and {e.trajectory_id for e in finished} == {"par"}


def test_invalid_trajectory_id_is_rejected_at_setup() -> None:
    with pytest.raises(ValueError):
        agentkv.trajectory("")
