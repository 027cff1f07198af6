"""The bench's client path: one streamed token-id completion through the product's client.

Every request the bench sends goes this way, the replayed turns
(:mod:`agentkv.bench.run._driver`) and the testbed's calibration requests
(:mod:`agentkv.bench.testbed._probe`) alike: an openai client wrapped by
:func:`agentkv.wrap_openai` for vLLM, a completion whose output length is exact
(``max_tokens`` with ``min_tokens`` and ``ignore_eos``), streamed, with the answer's token
ids read back (``return_token_ids``), the cached prompt tokens from the usage chunk and
the answering replica from :data:`~agentkv.bench.testbed._servedby.SERVED_BY_HEADER`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from agentkv.bench.testbed._servedby import SERVED_BY_HEADER

__all__ = ["STREAM_INTERVAL", "one_turn", "wrap_client"]

_log = logging.getLogger("agentkv")

#: Tokens per streamed chunk after the first (vLLM's per-request ``stream_interval``).
#: The first token and the last chunk are sent at once, so TTFT and the answer are
#: unchanged; batching the rest spares the API server and the client a chunk per token.
STREAM_INTERVAL = 16


def wrap_client(client: Any, options: Mapping[str, Any] | None = None) -> tuple[Any, bool]:
    """``client`` wrapped by ``agentkv.wrap_openai`` for vLLM with ``options`` (extra
    :class:`~agentkv.ClientOptions` fields) and True, or as it is and False."""
    try:
        from agentkv.client._options import ClientOptions
        from agentkv.client._wrap import wrap_openai as wrap
    except ImportError as exc:  # client wrapper not installed yet
        _log.warning("agentkv.wrap_openai is unavailable (%s); replaying without hints", exc)
        return client, False
    return wrap(client, options=ClientOptions(backend="vllm", **(options or {}))), True


async def one_turn(
    client: Any, model: str, prompt: list[int], out_tokens: int
) -> tuple[list[int], int | None, float | None, str | None]:
    """Send one streamed completion; return (answer ids, cached tokens, ttft, served by).

    ``served by``: the response's :data:`~agentkv.bench.testbed._servedby.SERVED_BY_HEADER`
    (the replica's port, when the servers run that middleware), else None.

    The token ids travel in ``extra_body``, which the openai client sends as is: passed
    as ``prompt`` they go through its type-directed transform one int at a time, which
    costs ~20 µs per token (~0.16 s of client CPU for an 8k-token prompt, ten times what
    the API server spends on the turn). The request on the wire is the same.
    """
    t0 = time.monotonic()
    stream = await client.completions.create(
        model=model,
        prompt=[],  # replaced by extra_body["prompt"]
        max_tokens=out_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={
            "prompt": prompt,
            "min_tokens": out_tokens,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream_interval": STREAM_INTERVAL,
        },
    )
    ids: list[int] = []
    ttft: float | None = None
    cached: int | None = None
    response = getattr(stream, "response", None)
    served_by = response.headers.get(SERVED_BY_HEADER) if response is not None else None
    async for chunk in stream:
        if chunk.choices:
            if ttft is None:
                ttft = time.monotonic() - t0
            extra = getattr(chunk.choices[0], "token_ids", None)
            if extra is None and chunk.choices[0].model_extra:
                extra = chunk.choices[0].model_extra.get("token_ids")
            if extra:
                ids.extend(int(x) for x in extra)
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            details = getattr(usage, "prompt_tokens_details", None)
            if details is not None and getattr(details, "cached_tokens", None) is not None:
                cached = int(details.cached_tokens)
    return ids, cached, ttft, served_by
