"""Who may switch the policy mode: ``POST /agentkv/v1/mode`` in the route's own middleware
(the code vLLM's API server runs), in process, over a recording engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentkv.vllm._ratelimit import ControlLimit
from tests.support.control_fakes import control_request
from tests.support.requires import require_module


class _Engine:
    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []

    async def call_utility_async(self, method: str, payload: str) -> str:
        op = json.loads(payload)
        self.ops.append(op)
        return json.dumps({"mode": op.get("mode"), "previous": "act", "mode_switches": 1})


def _request(engine: _Engine, body: bytes, *, method: str = "POST", host: str = "127.0.0.1",
             keys: list[str] | None = None, auth: str | None = None) -> Any:  # fmt: skip
    path = "/agentkv/v1/mode"
    headers = {"content-type": "application/json", "content-length": str(len(body))}
    if auth is not None:
        headers["authorization"] = auth
    return control_request(
        engine, path, headers, method=method, body=body, host=host, api_keys=keys
    )


@pytest.fixture
def route(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    require_module("starlette")
    from agentkv.vllm import _control

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    _control.configure_limit(ControlLimit(burst=1000, rate_per_s=1.0))
    yield _control
    _control.configure_limit(None)


async def _post(route: Any, engine: _Engine, body: Any, **kw: Any) -> tuple[int, Any]:
    async def never(_: Any) -> Any:
        raise AssertionError("the control route answers its own paths")

    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await route.control_middleware(_request(engine, raw, **kw), never)
    return int(response.status_code), json.loads(response.body)


async def test_a_server_with_a_key_switches_only_for_its_key(route: Any) -> None:
    engine = _Engine()
    keys = ["operator-key"]
    status, _ = await _post(route, engine, {"mode": "off"}, keys=keys)
    assert status == 401
    status, _ = await _post(route, engine, {"mode": "off"}, keys=keys, auth="Bearer nope")
    assert status == 401
    status, answer = await _post(route, engine, {"mode": "off"}, keys=keys,
                                 auth="Bearer operator-key", host="10.0.0.9")  # fmt: skip
    assert status == 200 and answer["mode"] == "off"
    assert engine.ops == [{"op": "mode", "mode": "off"}]


async def test_a_server_without_a_key_switches_only_for_a_loopback_caller(route: Any) -> None:
    engine = _Engine()
    status, answer = await _post(route, engine, {"mode": "shadow"}, host="10.0.0.9")
    assert status == 403 and "--api-key" in answer["error"]
    assert engine.ops == []
    status, _ = await _post(route, engine, {"mode": "shadow"}, host="::1")
    assert status == 200 and engine.ops == [{"op": "mode", "mode": "shadow"}]


@pytest.mark.parametrize(
    "body",
    [{"mode": "sideways"}, {}, [1], b"not json", {"mode": None}, b"[" * 3000],
    ids=["unknown", "empty", "list", "not-json", "null", "deep"],
)
async def test_a_bad_mode_is_a_400_and_never_reaches_the_engine(route: Any, body: Any) -> None:
    engine = _Engine()
    status, answer = await _post(route, engine, body)
    assert status == 400 and answer["error"]
    assert engine.ops == []


async def test_only_post_switches(route: Any) -> None:
    engine = _Engine()
    status, _ = await _post(route, engine, b"", method="GET")
    assert status == 405 and engine.ops == []
