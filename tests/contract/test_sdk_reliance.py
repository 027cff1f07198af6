"""The SDK internals agentkv relies on exist on the installed versions, within the bounds.

The wrapper hooks one method of the client instance (``request(cast_to, options, *,
stream, stream_cls)``), reads and sets ``options.json_data`` / ``extra_json`` /
``headers`` / ``url``, subclasses the stream classes' ``__stream__`` and reads the raw
response header; the integrations implement LangChain's callback and middleware hooks
and the Agents SDK's model provider and tracing processor. pyproject.toml bounds each SDK
to the majors these checks ran on; a new major moves the bound only once they pass.
"""

from __future__ import annotations

import importlib
import inspect
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

#: distribution -> import name, for the SDKs whose internals are used
SDKS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "langgraph": "langgraph",
    "langchain": "langchain",
    "langchain-core": "langchain_core",
    "langchain-openai": "langchain_openai",
    "openai-agents": "agents",
}


def _requirements() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    out: dict[str, list[Requirement]] = {}
    for line in lines:
        req = Requirement(line)
        out.setdefault(req.name, []).append(req)
    return out


@pytest.mark.parametrize("dist", sorted(SDKS))
def test_every_relied_on_sdk_has_an_upper_bound_that_the_installed_version_meets(
    dist: str,
) -> None:
    reqs = _requirements().get(dist)
    assert reqs, f"{dist} is not declared in pyproject.toml"
    for req in reqs:
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), str(req)
    importlib.import_module(SDKS[dist])  # the dev extras hold every one
    version = metadata.version(dist)
    for req in reqs:
        assert req.specifier.contains(version, prereleases=True), (str(req), version)


def _request_signature_ok(cls: type) -> None:
    params = inspect.signature(cls.request).parameters  # type: ignore[attr-defined]
    assert list(params)[:3] == ["self", "cast_to", "options"]
    assert params["stream"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["stream_cls"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("name", ["openai", "anthropic"])
def test_the_client_request_path_and_options_fields_exist(name: str) -> None:
    sdk = importlib.import_module(name)
    sync_cls, async_cls = (
        (sdk.OpenAI, sdk.AsyncOpenAI) if name == "openai" else (sdk.Anthropic, sdk.AsyncAnthropic)
    )
    _request_signature_ok(sync_cls)
    _request_signature_ok(async_cls)
    assert inspect.iscoroutinefunction(async_cls.request)
    for cls in (sync_cls, async_cls):
        assert callable(cls.copy) and callable(cls.with_options)
    options = importlib.import_module(f"{name}._models").FinalRequestOptions
    assert {"url", "json_data", "extra_json", "headers"} <= set(options.model_fields)
    constants = importlib.import_module(f"{name}._constants")
    assert constants.RAW_RESPONSE_HEADER == "X-Stainless-Raw-Response"


@pytest.mark.parametrize("name", ["openai", "anthropic"])
def test_the_stream_classes_stream_through_dunder_stream(name: str) -> None:
    sdk = importlib.import_module(name)
    assert inspect.isgeneratorfunction(sdk.Stream.__stream__)
    assert inspect.isasyncgenfunction(sdk.AsyncStream.__stream__)
    for cls in (sdk.Stream, sdk.AsyncStream):
        assert "response" in inspect.signature(cls.__init__).parameters
        assert callable(cls.close)


def test_langchain_core_callback_hooks_exist() -> None:
    """The handler needs only langchain-core's callback interface."""
    callbacks = importlib.import_module("langchain_core.callbacks")
    base = callbacks.BaseCallbackHandler
    from agentkv.integrations._lg_callbacks import AgentKVCallbackHandler

    hooks = [n for n in vars(AgentKVCallbackHandler) if n.startswith("on_")]
    assert hooks
    assert [n for n in hooks if not callable(getattr(base, n, None))] == []


def test_langchain_middleware_hooks_exist() -> None:
    middleware = importlib.import_module("langchain.agents.middleware")
    from agentkv.integrations.langgraph import AgentKVMiddleware

    hooks = [
        n
        for n in vars(AgentKVMiddleware)
        if n.split("_", 1)[0] in ("before", "after", "wrap", "abefore", "aafter", "awrap")
    ]
    assert hooks
    assert [n for n in hooks if not hasattr(middleware.AgentMiddleware, n)] == []
    importlib.import_module("langchain.agents.middleware.types").PrivateStateAttr  # noqa: B018
    assert callable(importlib.import_module("langgraph.config").get_config)


def test_agents_sdk_model_provider_and_tracing_interfaces_exist() -> None:
    from agents.models.interface import Model, ModelProvider
    from agents.tracing import TracingProcessor

    assert {"get_response", "stream_response"} <= Model.__abstractmethods__
    assert "get_model" in ModelProvider.__abstractmethods__
    for hook in ("on_trace_start", "on_trace_end", "on_span_start", "on_span_end"):
        assert hook in TracingProcessor.__abstractmethods__


def test_anthropic_tracing_points_exist() -> None:
    """The SDK's own span (``agentkv.client._sdk_span``): the client's tracing option and
    tracer, the request's ``post_parser`` (run while parsing, inside the call span), and
    the span's instrumentation scope."""
    sdk = importlib.import_module("anthropic")
    from agentkv.client._sdk_span import SDK_SCOPES

    client = sdk.Anthropic(api_key="k", base_url="http://127.0.0.1:9", open_telemetry=False)
    assert isinstance(client._open_telemetry, dict)
    assert client._open_telemetry["traces"]["enabled"] is False and client._tracer is None
    client.close()
    options = importlib.import_module("anthropic._models").FinalRequestOptions
    assert {"post_parser", "span_name"} <= set(options.model_fields)
    assert importlib.import_module("anthropic._tracing").INSTRUMENTATION_SCOPE in SDK_SCOPES


def test_langgraph_passes_the_checkpointer_in_the_run_config() -> None:
    """The callback handler reads a run's checkpointer from its config under this key."""
    constants = importlib.import_module("langgraph._internal._constants")
    from agentkv.integrations import _lg_callbacks

    assert constants.CONFIG_KEY_CHECKPOINTER == _lg_callbacks._CONFIG_CHECKPOINTER
