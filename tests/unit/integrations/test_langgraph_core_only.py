"""The LangGraph callback handler where only langchain-core (and langgraph) is installed.

``pip install langgraph langchain-openai`` brings langchain-core but not the ``langchain``
package, which only the ``create_agent`` middleware needs. Each test runs a fresh Python
whose import system refuses ``langchain`` (and, in one, ``langgraph``) as if they were not
installed, then drives a real graph or chain with the handler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# A meta-path finder that makes the named top-level packages (and their submodules)
# unimportable, as if they were not installed; ``langchain_core`` and the like are a
# different top-level name and stay importable.
BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Absent())
"""

GRAPH_RUN = """
import json, sys
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentkv.integrations.langgraph import AgentKVCallbackHandler, tool_node
from agentkv.testing import capture_events

@tool
def grep(pattern: str) -> str:
    \"\"\"Search.\"\"\"
    return "3 matches"

class Fake(GenericFakeChatModel):
    def bind_tools(self, tools, **kwargs):
        return self

call = {"name": "grep", "args": {"pattern": "TODO"}, "id": "c1"}
llm = Fake(messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage(content="ok")]))
g = StateGraph(MessagesState)
g.add_node("agent", lambda s: {"messages": [llm.invoke(s["messages"])]})
g.add_node("tools", ToolNode([grep]))
g.add_edge(START, "agent")
g.add_conditional_edges("agent", tools_condition)
g.add_edge("tools", "agent")
handler = AgentKVCallbackHandler(tool_classes={"grep": "search"}, model_events=True)
config = {"configurable": {"thread_id": "t-core"}, "callbacks": [handler]}
with capture_events() as events:
    g.compile().invoke({"messages": [("user", "go")]}, config)
try:
    from agentkv.integrations.langgraph import AgentKVMiddleware
    error = None
except ImportError as exc:
    error = str(exc)
print(json.dumps({
    "events": [[e.trajectory_id, e.turn_id, e.event, e.tool_class] for e in events],
    "middleware_error": error,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "langchain"),
    "tool_node": type(tool_node([grep])).__name__,
}))
"""

CHAIN_RUN = """
import json, sys
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool

from agentkv.integrations.langgraph import AgentKVCallbackHandler
from agentkv.testing import capture_events

@tool
def grep(pattern: str) -> str:
    \"\"\"Search.\"\"\"
    return "3 matches"

chain = RunnableLambda(lambda q: {"pattern": q}) | grep
handler = AgentKVCallbackHandler(tool_classes={"grep": "search"})
with capture_events() as events:
    chain.invoke("TODO", {"metadata": {"thread_id": "t-chain"}, "callbacks": [handler]})
print(json.dumps({
    "events": [[e.trajectory_id, e.turn_id, e.event, e.tool_class] for e in events],
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("langchain", "langgraph")),
}))
"""


def _run_without(blocked: str, script: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    code = BLOCKER + textwrap.dedent(script)
    proc = subprocess.run(
        [sys.executable, "-c", code, blocked],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_blocker_makes_langchain_unimportable() -> None:
    """The finder really hides ``langchain`` (else the tests below prove nothing)."""
    out = _run_without(
        "langchain",
        """
        import json
        try:
            import langchain.agents
            found = True
        except ModuleNotFoundError:
            found = False
        import langchain_core
        print(json.dumps({"found": found}))
        """,
    )
    assert out == {"found": False}


def test_handler_imports_and_works_without_langchain() -> None:
    """The handler, imported from the public module, maps a real graph's thread, turns
    and stock-ToolNode tool calls with langchain-core and langgraph alone."""
    out = _run_without("langchain", GRAPH_RUN)
    assert out["events"] == [
        ["t-core", 0, "model_started", None],
        ["t-core", 0, "tool_started", "search"],
        ["t-core", 0, "tool_finished", "search"],
        ["t-core", 1, "model_started", None],
        ["t-core", 1, "tool_started", "human"],  # the thread's conversation pauses
    ]
    assert out["loaded"] == []
    assert out["tool_node"] == "ToolNode"


def test_middleware_without_langchain_says_what_to_install() -> None:
    out = _run_without("langchain", GRAPH_RUN)
    error = out["middleware_error"]
    assert isinstance(error, str)
    assert "AgentKVMiddleware needs LangChain v1" in error
    assert "pip install" in error and "langchain" in error
    assert "AgentKVCallbackHandler needs only langchain-core" in error


def test_handler_works_with_langchain_core_alone() -> None:
    """Neither ``langchain`` nor ``langgraph``: the handler still maps a plain chain's
    tool run (LangChain callbacks are all it uses)."""
    out = _run_without("langchain,langgraph", CHAIN_RUN)
    assert out["events"] == [
        ["t-chain", 0, "tool_started", "search"],
        ["t-chain", 0, "tool_finished", "search"],
        ["t-chain", 0, "tool_started", "human"],
    ]
    assert out["loaded"] == []
