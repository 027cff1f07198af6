"""The bound on new salt scopes per source (``agentkv.vllm._saltgate``): the decision on a
fake clock, and the ASGI middleware over a recording app (the body vLLM would read)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv.vllm import _saltgate
from agentkv.vllm._profile import ServeProfile
from agentkv.vllm._saltgate import (
    ENV_SALT_BURST,
    ENV_SALT_RATE,
    SaltGate,
    SaltGateMiddleware,
    SaltLimit,
    configure_salt_gate,
    source_key,
)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def _body(salt: str | None, **xargs: Any) -> bytes:
    obj: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if salt is not None:
        obj["cache_salt"] = salt
    if xargs:
        obj["vllm_xargs"] = xargs
    return json.dumps(obj).encode()


HINT = {"agentkv_trajectoryId": "t1", "agentkv_action": "retain"}


def test_one_source_opens_its_burst_of_new_salts_then_one_per_refill() -> None:
    clock = Clock()
    gate = SaltGate(SaltLimit(burst=3, rate_per_s=1.0), clock=clock)
    got = [gate.admit("attacker", f"made-up-{i}") for i in range(10)]
    assert got == [True] * 3 + [False] * 7
    assert gate.limited == 7 and gate.admitted == 3
    assert gate.admit("attacker", "made-up-0")  # a known salt costs nothing
    assert gate.admit("someone-else", "own-salt")  # another source has its own bucket
    clock.now += 1.0
    assert gate.admit("attacker", "made-up-42") and not gate.admit("attacker", "made-up-43")


def test_a_salt_another_source_opened_is_known_to_every_source() -> None:
    gate = SaltGate(SaltLimit(burst=1, rate_per_s=0.001), clock=Clock())
    assert gate.admit("a", "shared") and gate.admit("a", "a-only") is False
    assert gate.admit("b", "shared")  # b's bucket is untouched
    assert gate.admit("b", "b-own")


def test_over_the_bound_the_hints_go_and_the_salt_and_other_xargs_stay() -> None:
    gate = SaltGate(SaltLimit(burst=1, rate_per_s=0.001), clock=Clock())
    kept = gate.filter_body(_body("s0", **HINT), "src")  # within the burst: hints kept
    assert kept is not None and json.loads(kept)["vllm_xargs"] == {**HINT, "agentkv_source": "src"}
    out = gate.filter_body(_body("s1", **HINT, other=3), "src")
    assert out is not None
    obj = json.loads(out)
    assert obj["cache_salt"] == "s1" and obj["vllm_xargs"] == {"other": 3}
    assert obj["messages"] == [{"role": "user", "content": "hi"}]
    out = gate.filter_body(_body("s2", agentkv_hints='{"x": 1}'), "src")
    assert out is not None and "vllm_xargs" not in json.loads(out)
    assert gate.stats() == {"new_salts_admitted": 1, "new_salts_limited": 2}


def test_an_escaped_hint_key_is_read_as_the_server_reads_it() -> None:
    gate = SaltGate(SaltLimit(burst=1, rate_per_s=0.001), clock=Clock())
    gate.admit("src", "spent")
    raw = b'{"cache_salt": "s9", "vllm_xargs": {"\\u0061gentkv_trajectoryId": "t"}}'
    out = gate.filter_body(raw, "src")
    assert out is not None and "vllm_xargs" not in json.loads(out)


@pytest.mark.parametrize(
    "body",
    [
        _body("new", other=1),  # no hint: the plugin opens no scope for it
        b"not json agentkv_",
        b"[1, 2]",
    ],
)
def test_requests_that_open_no_scope_pass_unchanged_and_spend_nothing(body: bytes) -> None:
    gate = SaltGate(SaltLimit(burst=1, rate_per_s=0.001), clock=Clock())
    assert gate.filter_body(body, "src") is None
    assert gate.limited == 0 and gate.admit("src", "fresh")


def test_rate_zero_turns_the_bound_off() -> None:
    gate = SaltGate(SaltLimit(burst=1, rate_per_s=0.0), clock=Clock())
    outs = [gate.filter_body(_body(f"s{i}", **HINT), "src") for i in range(50)]
    assert all(o is not None and json.loads(o)["vllm_xargs"]["agentkv_action"] for o in outs)
    assert gate.limited == 0


@pytest.mark.parametrize("salt", [None, ""])
def test_the_unsalted_scope_spends_nothing_and_carries_its_source(salt: str | None) -> None:
    gate = SaltGate(SaltLimit(burst=1, rate_per_s=0.001), clock=Clock())
    out = gate.filter_body(_body(salt, **HINT), "src")
    assert out is not None and json.loads(out)["vllm_xargs"]["agentkv_source"] == "src"
    assert gate.limited == 0 and gate.admit("src", "fresh")


def test_a_source_the_client_names_is_replaced_by_its_own() -> None:
    """Finding (issue 31): shares were per salt, so many salts of one source took many
    parts. The engine now groups them by the source the gate sets; a client cannot name
    another's source (or none) by sending the key itself, escaped or not."""
    gate = SaltGate(SaltLimit(burst=8, rate_per_s=0.001), clock=Clock())
    for body in (
        _body("s1", **HINT, agentkv_source="bearer:victim"),
        b'{"cache_salt": "s2", "vllm_xargs": {"\\u0061gentkv_source": "bearer:victim"}}',
    ):
        out = gate.filter_body(body, "addr:attacker")
        assert out is not None
        assert json.loads(out)["vllm_xargs"]["agentkv_source"] == "addr:attacker"


def test_the_source_is_the_bearer_token_else_the_address_never_the_salt() -> None:
    assert source_key({"authorization": "Bearer k1"}, "10.0.0.1") == source_key(
        {"authorization": "Bearer k1"}, "10.0.0.2"
    )
    assert source_key({}, "10.0.0.1") != source_key({}, "10.0.0.2")
    assert source_key({"authorization": "Bearer k1"}, None) != source_key({}, None)
    assert "k1" not in source_key({"authorization": "Bearer k1"}, None)


def test_the_profile_carries_the_bound_to_the_api_server() -> None:
    env = ServeProfile(platform="cpu", new_salt_burst=5, new_salt_rate_per_s=0.5).env()
    assert env[ENV_SALT_BURST] == "5" and env[ENV_SALT_RATE] == "0.5"
    assert SaltLimit.from_env(env) == SaltLimit(5, 0.5)
    assert SaltLimit.from_env({}) == SaltLimit(64, 1.0)  # on by default
    assert SaltLimit.from_env({ENV_SALT_BURST: "x"}) == SaltLimit()
    argv = ServeProfile(platform="cpu", model="/m", port=1).to_argv()
    assert "agentkv.vllm._saltgate.SaltGateMiddleware" in argv


# -- the middleware ----------------------------------------------------------------------------
class _App:
    """An ASGI app that reads the whole body, as vLLM's routes do, and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lengths: list[str | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks = []
        while True:
            m = await receive()
            chunks.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        self.bodies.append(b"".join(chunks))
        headers = dict(scope["headers"])
        self.lengths.append(headers.get(b"content-length", b"").decode() or None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture()
def gate() -> Iterator[SaltGate]:
    yield configure_salt_gate(SaltLimit(burst=4, rate_per_s=0.001))
    configure_salt_gate(None)


def _call(app: Any, body: bytes, *, host: str = "10.1.1.1", auth: str | None = None,
          keys: list[str] | None = None, chunk: int = 0) -> int:  # fmt: skip
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if auth is not None:
        headers.append((b"authorization", auth.encode()))
    server = SimpleNamespace(state=SimpleNamespace(args=SimpleNamespace(api_key=keys)))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": headers, "client": (host, 5000), "app": server}  # fmt: skip
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
        for i, p in enumerate(parts)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(SaltGateMiddleware(app)(scope, receive, send))
    return int(sent[0]["status"])


def test_made_up_salts_from_one_address_reach_vllm_without_hints_past_the_burst(
    gate: SaltGate,
) -> None:
    """Many made-up salts from one source cannot open unbounded scopes: past its burst the
    server reads no hint from them (no scope, no lease), and every call is still a 200."""
    app = _App()
    statuses = [_call(app, _body(f"fake-{i}", **HINT), chunk=17) for i in range(40)]
    assert statuses == [200] * 40
    hinted = [b"agentkv_trajectoryId" in b for b in app.bodies]
    assert hinted == [True] * 4 + [False] * 36
    assert all(b"agentkv_source" in b for b in app.bodies[:4])
    assert all(int(n or 0) == len(b) for n, b in zip(app.lengths, app.bodies, strict=True))
    assert gate.stats() == {"new_salts_admitted": 4, "new_salts_limited": 36}
    _call(app, _body("victim", **HINT), host="10.9.9.9")  # another source is not held back
    assert b"agentkv_" in app.bodies[-1]


def test_with_the_bound_off_the_middleware_still_sets_the_source() -> None:
    configure_salt_gate(SaltLimit(burst=1, rate_per_s=0.0))
    try:
        app = _App()
        _call(app, _body("s", **HINT, agentkv_source="forged"), auth="Bearer k", keys=["k"])
        assert json.loads(app.bodies[0])["vllm_xargs"]["agentkv_source"] == source_key(
            {"authorization": "Bearer k"}, "10.1.1.1"
        )
    finally:
        configure_salt_gate(None)


def test_a_request_the_server_refuses_for_its_key_spends_nothing(gate: SaltGate) -> None:
    app = _App()
    for i in range(10):
        _call(app, _body(f"x{i}", **HINT), auth="Bearer wrong", keys=["right"])
    assert gate.stats() == {"new_salts_admitted": 0, "new_salts_limited": 0}
    assert all(b"agentkv_" in b for b in app.bodies)  # untouched: vLLM answers it 401


def test_gets_and_control_routes_pass_through(gate: SaltGate, monkeypatch: Any) -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": []}
    asyncio.run(SaltGateMiddleware(app)(scope, None, None))  # type: ignore[arg-type]
    scope = {**scope, "method": "POST", "path": "/agentkv/v1/events"}
    asyncio.run(SaltGateMiddleware(app)(scope, None, None))  # type: ignore[arg-type]
    assert seen == ["/v1/models", "/agentkv/v1/events"]


def test_the_module_default_gate_reads_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv(ENV_SALT_BURST, "7")
    monkeypatch.setenv(ENV_SALT_RATE, "0")
    monkeypatch.setattr(_saltgate, "_GATE", None)
    assert _saltgate.get_salt_gate().limit == SaltLimit(7, 0.0)
    monkeypatch.setattr(_saltgate, "_GATE", None)
