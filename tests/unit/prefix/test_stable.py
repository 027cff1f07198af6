"""stable_tools, canonical_json and fingerprint: stable bytes whatever the input order."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from enum import Enum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

import agentkv
from agentkv import ToolSchemaError, canonical_json, fingerprint, stable_tools
from agentkv.prefix._stable import parse_docstring

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the repository.",
        "parameters": {
            "type": "object",
            "required": ["query"],
            "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "limit": {"type": "integer", "minimum": 1.0, "default": 10},
            },
        },
    },
}
# The same tool with every dict built in the opposite key order.
SEARCH_REVERSED = {
    "function": {
        "parameters": {
            "properties": {
                "limit": {"default": 10, "minimum": 1, "type": "integer"},
                "query": {"description": "What to look for.", "type": "string"},
            },
            "required": ["query"],
            "type": "object",
        },
        "description": "Search the repository.",
        "name": "search",
    },
    "type": "function",
}
READ = {"name": "read_file", "parameters": {"type": "object", "properties": {}}}


def _rendered(tools: list[dict[str, Any]]) -> str:
    """What a chat template's tojson filter would emit (insertion order, no sorting)."""
    return json.dumps(tools, ensure_ascii=False)


def test_key_order_and_tool_order_do_not_change_the_rendered_bytes() -> None:
    a = stable_tools([SEARCH, READ])
    b = stable_tools([READ, SEARCH_REVERSED])
    assert _rendered(a) == _rendered(b)
    assert [t["function"]["name"] for t in a] == ["read_file", "search"]


def test_output_is_chat_completions_shape_with_declared_wrapper_order() -> None:
    (tool,) = stable_tools([SEARCH_REVERSED])
    assert list(tool) == ["type", "function"]
    assert list(tool["function"]) == ["name", "description", "parameters"]
    params = tool["function"]["parameters"]
    assert list(params) == ["properties", "required", "type"]
    assert list(params["properties"]) == ["limit", "query"]
    assert list(params["properties"]["limit"]) == ["default", "minimum", "type"]


def test_lists_keep_their_order() -> None:
    tool = {
        "name": "pick",
        "parameters": {
            "type": "object",
            "properties": {"color": {"enum": ["red", "blue", "green"]}},
            "required": ["color", "alpha"],
        },
    }
    (out,) = stable_tools([tool])
    params = out["function"]["parameters"]
    assert params["properties"]["color"]["enum"] == ["red", "blue", "green"]
    assert params["required"] == ["color", "alpha"]


def test_integral_floats_fold_to_ints_and_other_floats_stay() -> None:
    (out,) = stable_tools([{"name": "f", "parameters": {"minimum": 1.0, "step": 0.25, "z": -0.0}}])
    params = out["function"]["parameters"]
    assert params == {"minimum": 1, "step": 0.25, "z": 0}
    assert type(params["minimum"]) is int and type(params["z"]) is int


def test_input_is_not_modified_and_output_shares_no_dicts() -> None:
    original = json.loads(json.dumps(SEARCH))
    (out,) = stable_tools([original])
    assert original == SEARCH and list(original["function"]) == list(SEARCH["function"])
    out["function"]["parameters"]["properties"]["query"]["type"] = "number"
    assert original["function"]["parameters"]["properties"]["query"]["type"] == "string"


def test_idempotent_on_examples() -> None:
    once = stable_tools([SEARCH, READ])
    twice = stable_tools(once)
    assert _rendered(once) == _rendered(twice)


def test_extra_keys_are_kept_after_the_declared_ones() -> None:
    tool = {
        "cache_control": {"type": "ephemeral"},
        "type": "function",
        "function": {"strict": True, "x-extra": 1, "name": "n", "parameters": {}},
    }
    (out,) = stable_tools([tool])
    assert list(out) == ["type", "function", "cache_control"]
    assert list(out["function"]) == ["name", "parameters", "strict", "x-extra"]


# --- input forms ----------------------------------------------------------------------


def run_shell(cmd: str, timeout_s: float = 30.0, *, cwd: str | None = None) -> str:
    """Run a shell command in the workspace.

    Args:
        cmd: The command line.
        timeout_s (float): Seconds before the command
            is killed.
        cwd: Working directory.

    Returns:
        The output.
    """
    return cmd


class Mode(str, Enum):  # noqa: UP042 - str() of this form is "Mode.FAST", not the value
    FAST = "fast"
    SLOW = "slow"


class Edit(BaseModel):
    """Replace text in a file."""

    path: str = Field(description="File to edit.")
    old: str
    new: str
    count: int = 1


def test_plain_function_schema_comes_from_signature_and_docstring() -> None:
    (out,) = stable_tools([run_shell])
    fn = out["function"]
    assert fn["name"] == "run_shell"
    assert fn["description"] == "Run a shell command in the workspace."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["cmd"]
    assert params["properties"]["cmd"] == {"description": "The command line.", "type": "string"}
    assert params["properties"]["timeout_s"] == {
        "default": 30,
        "description": "Seconds before the command is killed.",
        "type": "number",
    }
    assert params["properties"]["cwd"]["description"] == "Working directory."
    assert params["properties"]["cwd"]["default"] is None


def test_function_with_literal_and_enum_annotations() -> None:
    def pick(mode: Mode, level: Literal["a", "b"] = "a") -> None:
        """Pick a mode."""

    (out,) = stable_tools([pick])
    params = out["function"]["parameters"]
    assert params["properties"]["level"]["enum"] == ["a", "b"]
    assert "Mode" in params["$defs"]
    assert params["$defs"]["Mode"]["enum"] == ["fast", "slow"]


def test_pydantic_model_becomes_a_tool() -> None:
    (out,) = stable_tools([Edit])
    fn = out["function"]
    assert fn["name"] == "Edit"
    assert fn["description"] == "Replace text in a file."
    assert fn["parameters"]["required"] == ["path", "old", "new"]
    assert fn["parameters"]["properties"]["path"]["description"] == "File to edit."
    assert "title" not in fn["parameters"]


def test_mixed_forms_sorted_by_name_and_idempotent() -> None:
    out = stable_tools([run_shell, Edit, SEARCH, READ])
    assert [t["function"]["name"] for t in out] == ["Edit", "read_file", "run_shell", "search"]
    assert _rendered(stable_tools(out)) == _rendered(out)


def test_docstring_styles() -> None:
    google = parse_docstring(
        """Do it.

        More text.

        Args:
            a (int): first
                continued.
            b: second.

        Raises:
            ValueError: never.
        """
    )
    assert google == ("Do it.\n\nMore text.", {"a": "first continued.", "b": "second."})
    rest = parse_docstring("Do it.\n\n:param a: first\n    more\n:param int b: second\n:returns: x")
    assert rest == ("Do it.", {"a": "first more", "b": "second"})
    numpy = parse_docstring(
        "Do it.\n\nParameters\n----------\na : int\n    first\nb\n    second\n\n"
        "Returns\n-------\nint\n    nothing"
    )
    assert numpy == ("Do it.", {"a": "first", "b": "second"})
    assert parse_docstring(None) == ("", {})


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "needle"),
    [
        ([{"description": "no name"}], "tool #0: missing or empty 'name'"),
        ([{"type": "function", "function": {"name": ""}}], "missing or empty 'name'"),
        ([READ, {"name": "read_file"}], "tool #1 ('read_file'): another tool is also named"),
        ([{"name": "s", "parameters": {"enum": {"a", "b"}}}], "$.function.parameters.enum"),
        ([{"name": "nan", "parameters": {"minimum": math.nan}}], "NaN"),
        ([{"name": "k", "parameters": {1: "x"}}], "int key"),
        ([{"name": "o", "parameters": {"x": object()}}], "not a JSON value"),
        ([{"name": "d", "description": 3}], "'description' must be a string"),
        ([{"type": "web_search", "function": {"name": "w"}}], "only function tools"),
        ([42], "int 42 is not a tool"),
    ],
)
def test_invalid_tools_raise_tool_schema_error_naming_the_tool(tools: Any, needle: str) -> None:
    with pytest.raises(ToolSchemaError) as info:
        stable_tools(tools)
    assert needle in str(info.value)
    assert isinstance(info.value, agentkv.AgentKVError)


def test_single_tool_dict_instead_of_list_is_refused() -> None:
    with pytest.raises(ToolSchemaError, match="wrap a single tool in a list"):
        stable_tools(SEARCH)  # type: ignore[arg-type]


def test_var_args_function_is_refused() -> None:
    def f(*args: str) -> None: ...

    with pytest.raises(ToolSchemaError, match=r"\*args"):
        stable_tools([f])


def test_lambda_is_refused() -> None:
    with pytest.raises(ToolSchemaError, match="no usable __name__"):
        stable_tools([lambda x: x])


# --- canonical_json and fingerprint -------------------------------------------------------


def test_canonical_json_bytes() -> None:
    assert canonical_json({"b": 1.0, "a": [1, 2.5, "é", None, True]}) == (
        '{"a":[1,2.5,"é",null,true],"b":1}'.encode()
    )
    assert canonical_json((1, 2)) == b"[1,2]"
    assert canonical_json(Mode.FAST) == b'"fast"'
    assert canonical_json(1e300) == b"1e+300"


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, {"x": [math.nan]}])
def test_canonical_json_rejects_nan_and_infinity(bad: Any) -> None:
    with pytest.raises(ValueError, match="NaN or infinity"):
        canonical_json(bad)


@pytest.mark.parametrize("bad", [{1, 2}, b"x", object(), {"a": {2: 1}}])
def test_canonical_json_rejects_non_json_values(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"canonical_json: value at \$"):
        canonical_json(bad)


def test_fingerprint_is_order_independent_and_content_sensitive() -> None:
    a = fingerprint(tools=[SEARCH, READ], system="You are a coding agent.")
    b = fingerprint(tools=[READ, SEARCH_REVERSED], system="You are a coding agent.")
    assert a == b and len(a) == 64 and int(a, 16) >= 0
    assert fingerprint(tools=[SEARCH, READ], system="You are a coding agent!") != a
    assert fingerprint(tools=[SEARCH]) != fingerprint(tools=[SEARCH, READ])
    assert fingerprint(system="x") != fingerprint(tools=[], system="x")
    with pytest.raises(TypeError):
        fingerprint()


# --- across processes ---------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import hashlib, json, sys
    import agentkv

    def grep(pattern: str, paths: list[str], ignore_case: bool = False) -> str:
        '''Search files.

        Args:
            pattern: Regular expression.
            paths: Files or folders.
        '''

    # Build dicts from a set so their insertion order follows this process's string hash.
    names = sorted({"alpha", "beta", "gamma", "delta", "epsilon"}, key=hash)
    props = {n: {"type": "string", "description": n.upper()} for n in names}
    tools = [{"name": n, "parameters": {"type": "object", "properties": props}} for n in names]
    tools.append(grep)
    out = agentkv.stable_tools(tools)
    sys.stdout.write(hashlib.sha256(json.dumps(out).encode()).hexdigest())
    sys.stdout.write(" " + agentkv.fingerprint(tools=tools, system="s"))
    """
)


def test_same_bytes_across_processes_with_different_hash_seeds() -> None:
    results = set()
    for seed in ("0", "1", "12345", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        results.add(proc.stdout)
    assert len(results) == 1, results
