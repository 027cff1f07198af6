"""``@agentkv.tool``, ``agentkv.tool_call`` and ``@agentkv.agent``.

The decorators detect at decoration time whether they wrap a plain function, a
coroutine function, a generator function or an async generator function, and pick a
thin body around one shared ``_enter`` / ``_exit`` pair. Return values and exceptions
pass through untouched; the signature, docstring and annotations are kept.

Outside any trajectory a decorated tool costs one context-variable lookup.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import AsyncGenerator, Callable, Generator
from types import TracebackType
from typing import Any, TypeVar, overload

from agentkv._errors import ConfigError
from agentkv._guard import internal_error
from agentkv.events import _pipeline
from agentkv.events._context import (
    CANCEL_TYPES,
    INHERIT,
    Trajectory,
    get_current,
    note_tool,
    trajectory,
)
from agentkv.events._metrics import record_tool

__all__ = ["agent", "tool", "tool_call"]

F = TypeVar("F", bound=Callable[..., Any])

_State = tuple[Trajectory, int] | None


def _check_name(value: str | None, what: str) -> None:
    if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
        raise ConfigError(f"{what} must be a non-empty string of at most 256 characters")


def _enter(tool_class: str, name: str, call_id: str | None = None) -> _State:
    traj = get_current()
    if traj is None:
        return None
    note_tool(traj, tool_class)
    if _pipeline.wanted("tool_started"):
        try:
            _pipeline.emit(
                traj.make_event(
                    "tool_started", tool_class=tool_class, tool_name=name, tool_call_id=call_id
                )
            )
        except Exception as exc:
            internal_error("tool_started event", exc)
    return traj, time.perf_counter_ns()


def _exit(
    state: _State,
    tool_class: str,
    name: str,
    exc_type: type[BaseException] | None,
    call_id: str | None = None,
) -> None:
    if state is None:
        return
    traj, t0 = state
    duration_ms = (time.perf_counter_ns() - t0) / 1e6
    if exc_type is None or issubclass(exc_type, GeneratorExit):
        status = "ok"
    elif issubclass(exc_type, CANCEL_TYPES):
        status = "cancelled"
    else:
        status = "error"
    if status != "cancelled":  # a cancelled tool's duration is not the tool's
        _pipeline.learn_tool_duration(tool_class, duration_ms / 1000.0)
    record_tool(name, tool_class, duration_ms / 1000.0, status)
    if not _pipeline.wanted("tool_finished"):
        return
    try:
        _pipeline.emit(
            traj.make_event(
                "tool_finished",
                tool_class=tool_class,
                tool_name=name,
                tool_call_id=call_id,
                status=status,
                duration_ms=duration_ms,
            )
        )
    except Exception as exc:
        internal_error("tool_finished event", exc)


class ToolCallScope:
    """A tool call as a ``with`` / ``async with`` block (see :func:`tool_call`)."""

    __slots__ = ("_state", "call_id", "name", "tool_class")

    def __init__(
        self, tool_class: str, name: str | None = None, call_id: str | None = None
    ) -> None:
        _check_name(tool_class, "tool_class")
        _check_name(name, "name")
        self.tool_class = tool_class
        self.name = name or tool_class
        self.call_id = call_id[:256] if isinstance(call_id, str) and call_id else None
        self._state: _State = None

    def __enter__(self) -> ToolCallScope:
        self._state = _enter(self.tool_class, self.name, self.call_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state, self._state = self._state, None
        _exit(state, self.tool_class, self.name, exc_type, self.call_id)

    async def __aenter__(self) -> ToolCallScope:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def tool_call(
    tool_class: str, *, name: str | None = None, call_id: str | None = None
) -> ToolCallScope:
    """Mark a block of code as one tool call: ``with agentkv.tool_call("shell"): ...``.

    ``call_id``: the framework's id of this tool call (``gen_ai.tool.call.id``), if any.
    """
    return ToolCallScope(tool_class, name, call_id)


def _wrap_tool(fn: F, tool_class: str, name: str) -> F:
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def agen_body(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            state = _enter(tool_class, name)
            agen = fn(*args, **kwargs)
            try:
                value = await agen.__anext__()
                while True:
                    try:
                        sent = yield value
                    except GeneratorExit:
                        await agen.aclose()
                        raise
                    except BaseException as thrown:
                        value = await agen.athrow(thrown)
                    else:
                        value = await agen.asend(sent)
            except StopAsyncIteration:
                _exit(state, tool_class, name, None)
            except BaseException as exc:
                _exit(state, tool_class, name, type(exc))
                raise

        wrapper: Any = agen_body
    elif inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_body(*args: Any, **kwargs: Any) -> Any:
            state = _enter(tool_class, name)
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                _exit(state, tool_class, name, type(exc))
                raise
            _exit(state, tool_class, name, None)
            return result

        wrapper = async_body
    elif inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_body(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            state = _enter(tool_class, name)
            try:
                result = yield from fn(*args, **kwargs)
            except BaseException as exc:
                _exit(state, tool_class, name, type(exc))
                raise
            _exit(state, tool_class, name, None)
            return result

        wrapper = gen_body
    else:

        @functools.wraps(fn)
        def sync_body(*args: Any, **kwargs: Any) -> Any:
            if get_current() is None:  # fast path outside any trajectory
                return fn(*args, **kwargs)
            state = _enter(tool_class, name)
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                _exit(state, tool_class, name, type(exc))
                raise
            _exit(state, tool_class, name, None)
            return result

        wrapper = sync_body
    wrapper.__agentkv_tool__ = {"tool_class": tool_class, "name": name}
    return wrapper  # type: ignore[no-any-return]


@overload
def tool(fn: F, /) -> F: ...
@overload
def tool(*, tool_class: str | None = None, name: str | None = None) -> Callable[[F], F]: ...
def tool(
    fn: F | None = None, /, *, tool_class: str | None = None, name: str | None = None
) -> F | Callable[[F], F]:
    """Instrument a tool: ``@agentkv.tool`` or ``@agentkv.tool(tool_class="shell")``.

    Works on functions, coroutine functions, generator and async generator functions,
    and methods. Inside a trajectory each call emits ``tool_started`` and
    ``tool_finished`` (with status ``ok`` / ``error`` / ``cancelled`` and a monotonic
    duration); the tool's arguments and results never enter an event. ``name`` defaults
    to the function's name and ``tool_class`` to ``name``.
    """
    _check_name(tool_class, "tool_class")
    _check_name(name, "name")

    def decorate(f: F) -> F:
        if not callable(f):
            raise TypeError(f"@agentkv.tool needs a callable, got {type(f).__name__}")
        tname = name or getattr(f, "__name__", None) or "tool"
        return _wrap_tool(f, tool_class or tname, tname)

    if fn is not None:
        return decorate(fn)
    return decorate


def _wrap_agent(fn: F, options: dict[str, Any]) -> F:
    def scope() -> Any:
        return trajectory(**options)

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def agen_body(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            async with scope():
                async for item in fn(*args, **kwargs):
                    yield item

        wrapper: Any = agen_body
    elif inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_body(*args: Any, **kwargs: Any) -> Any:
            async with scope():
                return await fn(*args, **kwargs)

        wrapper = async_body
    elif inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_body(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            with scope():
                return (yield from fn(*args, **kwargs))

        wrapper = gen_body
    else:

        @functools.wraps(fn)
        def sync_body(*args: Any, **kwargs: Any) -> Any:
            with scope():
                return fn(*args, **kwargs)

        wrapper = sync_body
    return wrapper  # type: ignore[no-any-return]


@overload
def agent(fn: F, /) -> F: ...
@overload
def agent(
    *,
    name: str | None = None,
    tenant: str | None = None,
    critical_path: bool | None = None,
) -> Callable[[F], F]: ...
def agent(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    tenant: str | None = None,
    critical_path: bool | None = None,
) -> F | Callable[[F], F]:
    """Run each call of an agent-loop function inside its own trajectory.

    ``@agentkv.agent`` or ``@agentkv.agent(name="planner", tenant="acme")``. A call made
    inside another trajectory becomes a subagent of it.
    """
    _check_name(name, "name")
    _check_name(tenant, "tenant")

    def decorate(f: F) -> F:
        if not callable(f):
            raise TypeError(f"@agentkv.agent needs a callable, got {type(f).__name__}")
        agent_name = name or getattr(f, "__name__", "agent")
        options = {
            "tenant": tenant,
            "parent": INHERIT,
            "metadata": {"agent_name": agent_name},
            "critical_path": critical_path,
        }
        return _wrap_agent(f, options)

    if fn is not None:
        return decorate(fn)
    return decorate
