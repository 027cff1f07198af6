"""What agentkv sends to a hosted API (OpenAI): ``prompt_cache_key`` and retention.

No network and no API key are needed: the client talks to an in-memory transport that
records the request and answers with a canned completion. The example prints the
request body agentkv would send.

- ``prompt_cache_key`` is a hash of the tenant and the trajectory *family* (the root
  trajectory, or ``metadata["cache_family"]``), so a subagent's calls route to the same
  cache as its parent's without fragmenting it per request;
- when the advice is to keep the prefix and the predicted tool gap outlives the
  in-memory cache (about 5-10 minutes idle), the model's longer-retention field is
  added: ``prompt_cache_retention="24h"`` on gpt-5.1 to gpt-5.5 (as here),
  ``prompt_cache_options.ttl`` on gpt-5.6 and later;
- a hosted API isolates caches per organization, not per tenant of yours: agentkv has
  no cache salt to send there, so a trajectory with a tenant needs
  ``allow_unsalted=True`` (without it the call raises ``TenantIsolationError``);
- no agentkv-specific fields or headers are sent: the hosted API rejects unknown
  parameters. Run::

    python examples/hosted_api.py
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
from openai import OpenAI

import agentkv

SENT: list[dict[str, Any]] = []


def answer(request: httpx2.Request) -> httpx2.Response:
    """Record the request; reply like the API would (no network)."""
    SENT.append(json.loads(request.content))
    return httpx2.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-5-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 1800,
                "completion_tokens": 2,
                "total_tokens": 1802,
                "prompt_tokens_details": {"cached_tokens": 1536},
            },
        },
    )


def main() -> None:
    # A gap model that has seen this workload's "ci_run" tool take 10-20 minutes.
    gaps = agentkv.GapModel(min_samples=3)
    for minutes in (12, 15, 18, 20, 14):
        gaps.observe("ci_run", minutes * 60.0)
    advisor = agentkv.Advisor(
        gaps, agentkv.CostModel(platform="hosted"), max_ttl_ms=3_600_000, short_gap_s=3600
    )
    http = httpx2.Client(transport=httpx2.MockTransport(answer))
    client = agentkv.wrap_openai(
        OpenAI(base_url="https://api.openai.com/v1", api_key="sk-not-used", http_client=http),
        options=agentkv.ClientOptions(backend="openai", advisor=advisor, allow_unsalted=True),
    )
    messages = [
        {"role": "system", "content": "You are a release engineer. " * 100},
        {"role": "user", "content": "ship it"},
    ]
    with agentkv.trajectory("release-42", tenant="acme"):
        client.chat.completions.create(model="gpt-5.1-mini", messages=messages)
        with agentkv.tool_call("ci_run"):
            pass  # the CI run would take ~15 minutes here
        messages.append({"role": "user", "content": "CI passed"})
        client.chat.completions.create(model="gpt-5.1-mini", messages=messages)
        with agentkv.trajectory("release-42/notes"):  # a subagent: same cache family
            client.chat.completions.create(model="gpt-5.1-mini", messages=messages[:1])
    for i, body in enumerate(SENT):
        extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
        print(f"request {i}: {json.dumps(extra, sort_keys=True)}")
    keys = {body["prompt_cache_key"] for body in SENT}
    print("one cache key for the whole family:", len(keys) == 1)
    print("cached_tokens reported:", agentkv.stats().cached_tokens)


if __name__ == "__main__":
    main()
