"""The Agents SDK without tracing: a model provider wrapper and group conversations.

The tracing processor sees nothing when the SDK's tracing is off (its own advice for
non-OpenAI backends). These pieces work either way::

    provider = AgentKVModelProvider()               # wraps the SDK's OpenAI provider
    async with conversation("thread-1"):            # the group's one trajectory
        await Runner.run(agent, "hi", run_config=RunConfig(model_provider=provider,
                                                            tracing_disabled=True))

- :class:`AgentKVModelProvider` wraps another provider (default: the SDK's
  ``OpenAIProvider``): the OpenAI client of each model it returns is wrapped with
  :func:`agentkv.wrap_openai` (hints, turn records), and a model without one (LiteLLM,
  ...) advances the turn itself;
- :func:`conversation` opens the trajectory of a ``group_id`` (or resumes it: a group
  is one trajectory across runs, like a LangGraph thread), makes it current for the
  block, and pauses it at the end (the idle pseudo-tool ``human`` starts; nothing is
  released). :func:`end_conversation` ends it; an idle TTL does too;
- tool events come from ``Runner.run(..., hooks=AgentKVRunHooks())``, which needs no
  tracing either.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from agents.models.interface import Model, ModelProvider

from agentkv._guard import internal_error, warn_once
from agentkv.client._wrap import is_wrapped, wrap_openai
from agentkv.events._context import Trajectory, model_call, resolve_current
from agentkv.integrations._common import ANY_TENANT, LiveTrajectories, active

__all__ = [
    "GROUPS",
    "PROCESSORS",
    "AgentKVModelProvider",
    "conversation",
    "end_conversation",
    "tracing_is_disabled",
]

#: The group conversations (shared by the tracing processor and :func:`conversation`).
GROUPS = LiveTrajectories()
#: Tracing processors set up in this process (for the tracing-off warning).
PROCESSORS: weakref.WeakSet[Any] = weakref.WeakSet()


def tracing_is_disabled() -> bool:
    """True when the SDK's tracing is off for the whole process."""
    try:
        from agents import trace
        from agents.tracing.traces import NoOpTrace

        return isinstance(trace("agentkv-probe"), NoOpTrace)
    except Exception:  # an SDK without these names: assume tracing works
        return False


class _Conversation:
    """``with`` / ``async with conversation(group_id)`` (see :func:`conversation`)."""

    def __init__(self, group_id: str, tenant: str | None) -> None:
        self.group_id = str(group_id)[:256]
        self.tenant = tenant

    @contextmanager
    def _scope(self) -> Iterator[Trajectory]:
        traj = GROUPS.open(
            self.group_id, tenant=self.tenant, metadata={"framework": "openai-agents"}
        )
        try:
            with active(traj):
                yield traj
        except BaseException as exc:
            GROUPS.finish(traj, exc)
            raise
        GROUPS.pause(traj)

    def __enter__(self) -> Trajectory:
        self._cm = self._scope()
        return self._cm.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    async def __aenter__(self) -> Trajectory:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)


def conversation(group_id: str, *, tenant: str | None = None) -> _Conversation:
    """The trajectory of an Agents SDK ``group_id``, current for the block (sync or async).

    Runs of one group are one trajectory: turns continue; between runs the conversation
    is paused, not released. An exception leaving the block ends it with status error.
    """
    return _Conversation(group_id, tenant)


def end_conversation(group_id: str, *, tenant: str | None = None) -> bool:
    """End a group's conversation (``trajectory_finished``; its KV released).

    ``tenant`` names the conversation's tenant; it is needed only where several tenants
    of one process use the same group id (then, without it, none is ended)."""
    which = ANY_TENANT if tenant is None else tenant
    return GROUPS.finish(str(group_id)[:256], tenant=which) is not None


def _warn_if_blind(tracing: Any) -> None:
    if resolve_current() is not None:
        return
    if PROCESSORS and getattr(tracing, "is_disabled", lambda: False)():
        warn_once(
            "agents-run-tracing-off",
            "agentkv: a run has tracing disabled, so AgentKVTracingProcessor sees it not; "
            "wrap the run in agentkv.integrations.openai_agents.conversation(group_id)",
        )
    elif not PROCESSORS:
        warn_once(
            "agents-provider-no-trajectory",
            "agentkv: AgentKVModelProvider's model is running outside any trajectory "
            "(no conversation(), no AgentKVTracingProcessor, no agentkv.trajectory()), so "
            "this run sends no hints and records no events; wrap the run in "
            "agentkv.integrations.openai_agents.conversation(group_id), or add "
            "AgentKVTracingProcessor with tracing on",
        )


class _AgentKVModel(Model):
    """A model of another provider, with turns and hints (see the module doc)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        client = getattr(inner, "_client", None)
        self.hinted = client is not None and is_wrapped(client)

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        """The inner model's answer (one turn)."""
        _warn_if_blind(args[6] if len(args) > 6 else kwargs.get("tracing"))
        if self.hinted:
            return await self.inner.get_response(*args, **kwargs)
        async with model_call(getattr(self.inner, "model", None)):
            return await self.inner.get_response(*args, **kwargs)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        """The inner model's stream (one turn)."""
        _warn_if_blind(args[6] if len(args) > 6 else kwargs.get("tracing"))
        if self.hinted:
            async for event in self.inner.stream_response(*args, **kwargs):
                yield event
            return
        async with model_call(getattr(self.inner, "model", None)):
            async for event in self.inner.stream_response(*args, **kwargs):
                yield event

    async def close(self) -> None:
        """Close the inner model."""
        await self.inner.close()


class AgentKVModelProvider(ModelProvider):
    """A model provider whose models carry agentkv hints and turns, tracing or not.

    Args:
        provider: the provider to wrap (default: the SDK's ``OpenAIProvider()``).
        wrap_options: passed to :func:`agentkv.wrap_openai` (``backend``, ``mode``, ...).
    """

    def __init__(self, provider: ModelProvider | None = None, **wrap_options: Any) -> None:
        if provider is None:
            from agents.models.openai_provider import OpenAIProvider

            provider = OpenAIProvider()
        self.provider = provider
        self.wrap_options = wrap_options

    def get_model(self, model_name: str | None) -> Model:
        """The wrapped provider's model, its OpenAI client wrapped."""
        inner = self.provider.get_model(model_name)
        try:
            client = getattr(inner, "_client", None)
            if client is not None and hasattr(client, "request"):
                wrap_openai(client, **self.wrap_options)
        except Exception as exc:
            internal_error("agents model provider", exc)
        return _AgentKVModel(inner)
