"""``AgentKVMiddleware``: the LangChain v1 ``create_agent`` middleware (needs ``langchain``).

Kept apart from the callback handler and the hand-built graph helpers, which need only
langchain-core and LangGraph: :mod:`agentkv.integrations.langgraph` imports this module
on first use of its names.

Durable threads: the agent state keeps, beside the trajectory id, the number of model
calls the trajectory has made (``agentkv_turns``, private like the id). The middleware
writes it with each model call's result (a state update returned with the model
response, so it is checkpointed with that step) and at the end of each run; a run that
finds its thread's trajectory not live in this process (a new process resumed the thread
from its checkpointer, or resumed an interrupt) continues the count from the state, so
the next model call is a resumed turn, not turn 0.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Annotated, Any, NotRequired

from agentkv._guard import internal_error
from agentkv.events._context import (
    Trajectory,
    continue_turns,
    current_trajectory,
    model_call,
)
from agentkv.integrations._common import ToolClasses
from agentkv.integrations._lg_common import (
    CONVERSATIONS,
    STATE_KEY,
    CallScope,
    child_trajectory_id,
    fit_id,
    is_wrapped,
    state_get,
    tool_scope,
    trajectory_id_for,
    wrap_chat_openai,
)

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState
    from langchain.agents.middleware import types as _mw_types
    from langchain.agents.middleware.types import ModelResponse, PrivateStateAttr
    from langchain_core.messages import AIMessage
    from langgraph.config import get_config
    from langgraph.types import Command
except ImportError as exc:
    raise ImportError(
        "AgentKVMiddleware needs LangChain v1 (the `langchain` package, for create_agent): "
        "pip install 'langchain>=1,<2' (or 'agentkv-cache[langgraph]'). "
        "AgentKVCallbackHandler needs only langchain-core."
    ) from exc

__all__ = ["TURNS_KEY", "AgentKVMiddleware", "AgentKVState"]

_LIVE = CONVERSATIONS
#: The private agent-state key holding the trajectory's number of model calls.
TURNS_KEY = "agentkv_turns"
#: A model response with a state update (langchain 1.x releases that have it; without
#: it the count is written at the end of each run only).
_Extended: Any = getattr(_mw_types, "ExtendedModelResponse", None)


class AgentKVState(AgentState[Any]):
    """Agent state with agentkv's private trajectory id (hidden from input and output)."""

    agentkv_trajectory_id: NotRequired[Annotated[str | None, PrivateStateAttr]]
    agentkv_turns: NotRequired[Annotated[int | None, PrivateStateAttr]]


def _current_config() -> Mapping[str, Any]:
    try:
        return get_config()
    except RuntimeError:  # called outside a runnable context
        return {}


class AgentKVMiddleware(AgentMiddleware[AgentKVState, Any, Any]):
    """LangChain v1 agent middleware: trajectories, tool events and request hints.

    Args:
        tool_classes: tool name -> tool class (a mapping or a function); unmapped
            names are their own class.
        tenant: tenant of the trajectories (isolates cache state between tenants).
        wrap_models: wrap ``ChatOpenAI`` clients with :func:`agentkv.wrap_openai`
            on first use (set False if you wrap them yourself).
        wrap_options: passed to ``wrap_openai`` (``backend="vllm"``, ``mode="shadow"``, ...).
    """

    state_schema = AgentKVState

    def __init__(
        self,
        *,
        tool_classes: ToolClasses = None,
        tenant: str | None = None,
        wrap_models: bool = True,
        **wrap_options: Any,
    ) -> None:
        super().__init__()
        self.tool_classes = tool_classes
        self.tenant = tenant
        self.wrap_models = wrap_models
        self.wrap_options = wrap_options

    # --- the run ---------------------------------------------------------------------
    def _begin(self, config: Mapping[str, Any], state: Any) -> str | None:
        try:
            configurable = config.get("configurable") or {}
            metadata = config.get("metadata") or {}
            cur = current_trajectory()
            if cur is not None and cur not in _LIVE:
                _LIVE.borrow(cur)  # the user opened a trajectory around the run
                return cur.trajectory_id
            name = str(metadata.get("lc_agent_name") or "agent")[:64]
            ns = str(configurable.get("checkpoint_ns") or "")
            parent_ns = ns.rsplit("|", 1)[0] if "|" in ns else ""
            thread_id = trajectory_id_for(config)
            parent: Trajectory | str | None = None
            if cur is not None:  # called from one of our model or tool calls: a subagent
                parent = cur
                tid = child_trajectory_id(cur.trajectory_id, name, parent_ns or uuid.uuid4().hex)
            elif parent_ns:  # a subgraph node
                parent = _LIVE.get(thread_id, self.tenant) or thread_id
                tid = child_trajectory_id(thread_id or "lg", name, parent_ns)
            else:
                tid = thread_id or f"lg-{uuid.uuid4().hex}"
            meta = {"agent_name": name, "framework": "langgraph"}
            traj = _LIVE.open(fit_id(tid), tenant=self.tenant, parent=parent, metadata=meta)
            _continue_from(traj, state)
            return traj.trajectory_id
        except Exception as exc:
            internal_error("langgraph before_agent", exc)
            return None

    def _trajectory(self, state: Any) -> Trajectory | None:
        tid = state_get(state, STATE_KEY)
        traj = _LIVE.get(tid, self.tenant)
        if traj is not None:
            return traj
        if isinstance(tid, str) and tid:  # e.g. resumed from a checkpoint in a new process
            traj = _LIVE.open(tid, tenant=self.tenant)
            _continue_from(traj, state)
            return traj
        return current_trajectory()

    def before_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """Open the run's trajectory (id from ``thread_id``) and keep its id in the state."""
        return {STATE_KEY: self._begin(_current_config(), state)}

    async def abefore_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """Async twin of :meth:`before_agent`."""
        return {STATE_KEY: self._begin(_current_config(), state)}

    def after_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """End the run: a thread's conversation pauses (the next invoke continues it);
        a run without a thread, or a subagent, ends (``trajectory_finished``). The
        trajectory's model-call count goes into the state (``agentkv_turns``)."""
        update: dict[str, Any] | None = None
        try:
            tid = state_get(state, STATE_KEY)
            traj = _LIVE.get(tid, self.tenant)
            if traj is not None:
                update = {TURNS_KEY: traj.num_model_calls}
            conversation = (
                traj is not None
                and traj.parent_id is None
                and tid == trajectory_id_for(_current_config())
            )
            if conversation:
                _LIVE.pause(traj)
            else:
                _LIVE.finish(traj if traj is not None else tid, tenant=self.tenant)
        except Exception as exc:
            internal_error("langgraph after_agent", exc)
        return update

    async def aafter_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """Async twin of :meth:`after_agent`."""
        return self.after_agent(state, runtime)

    # --- model calls -------------------------------------------------------------------
    def _model_scope(self, request: Any) -> tuple[CallScope, Trajectory | None]:
        traj = self._trajectory(request.state)
        llm = request.model
        inner: AbstractContextManager[Any] = nullcontext()
        try:
            if self.wrap_models:
                wrap_chat_openai(llm, **self.wrap_options)
            if not is_wrapped(llm):  # no client wrapper to advance the turn: do it here
                inner = model_call(getattr(llm, "model_name", None))
        except Exception as exc:
            internal_error("langgraph model instrumentation", exc)
        return CallScope(traj, inner), traj

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Run the model call inside the trajectory (hints via the wrapped client); the
        result carries the trajectory's model-call count as a state update."""
        scope, traj = self._model_scope(request)
        with scope:
            result = handler(request)
        return _with_turns(result, traj)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async twin of :meth:`wrap_model_call`."""
        scope, traj = self._model_scope(request)
        with scope:
            result = await handler(request)
        return _with_turns(result, traj)

    # --- tool calls --------------------------------------------------------------------
    def _tool_scope(self, request: Any) -> CallScope:
        return tool_scope(request, self._trajectory(request.state), self.tool_classes)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Run the tool call as a tool event pair with its class."""
        with self._tool_scope(request):
            return handler(request)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async twin of :meth:`wrap_tool_call`."""
        with self._tool_scope(request):
            return await handler(request)


def _continue_from(traj: Trajectory, state: Any) -> None:
    """Continue ``traj``'s turns from the count its own earlier runs left in ``state``."""
    if state_get(state, STATE_KEY) == traj.trajectory_id:
        continue_turns(traj, state_get(state, TURNS_KEY))


def _with_turns(result: Any, traj: Trajectory | None) -> Any:
    """``result`` with a state update recording ``traj``'s model-call count (unchanged
    where this langchain has no ``ExtendedModelResponse`` or ``result`` is not a model
    response)."""
    if traj is None or _Extended is None:
        return result
    try:
        if isinstance(result, AIMessage):
            response = ModelResponse(result=[result])
        elif isinstance(result, ModelResponse):
            response = result
        else:
            return result
        return _Extended(
            model_response=response, command=Command(update={TURNS_KEY: traj.num_model_calls})
        )
    except Exception as exc:
        internal_error("langgraph turn count", exc)
        return result
