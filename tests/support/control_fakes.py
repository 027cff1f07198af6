"""A fake of what vLLM's API server hands the control route's middleware: the request
(``app.state`` with the engine-core client and the server's API keys, path, headers,
client address, body stream), so the route's own code runs in process."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

__all__ = ["Headers", "control_request"]


class Headers(dict[str, str]):
    """Request headers, looked up case-insensitively (keys are stored lower-case)."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


def control_request(
    engine: Any,
    path: str,
    headers: dict[str, str],
    *,
    method: str = "GET",
    body: bytes = b"",
    host: str = "127.0.0.1",
    api_keys: list[str] | None = None,
) -> Any:
    """A request for the control middleware; ``engine`` answers ``call_utility_async``."""
    state = SimpleNamespace(
        engine_client=SimpleNamespace(engine_core=engine), args=SimpleNamespace(api_key=api_keys)
    )

    async def stream() -> Any:
        yield body

    return SimpleNamespace(
        app=SimpleNamespace(state=state),
        url=SimpleNamespace(path=path),
        scope={"path": path, "raw_path": path.encode(), "root_path": ""},
        method=method,
        headers=Headers({k.lower(): v for k, v in headers.items()}),
        client=SimpleNamespace(host=host, port=1),
        stream=stream,
    )
