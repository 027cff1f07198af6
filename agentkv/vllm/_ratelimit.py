"""A token bucket per caller on the ``/agentkv/v1/`` control route.

Every control request costs the engine (an event batch is one engine-core RPC carrying up
to 256 events), so one caller posting as fast as it can slows every generation. The route
therefore takes one token per request from the caller's bucket and answers ``429`` with
``Retry-After`` when the bucket is empty (:mod:`agentkv.vllm._control`).

- A bucket holds at most ``burst`` tokens and refills at ``rate_per_s``; a caller seen for
  the first time starts full. ``rate_per_s`` 0 turns the limit off.
- The caller is, in this order: the request's bearer token, else the tenant scope it names
  (``X-AgentKV-Cache-Salt``), else its client address (:func:`caller_key`). Keys are MACs
  under a per-process secret: no token or salt is kept in clear.
- At most :data:`MAX_CALLERS` buckets are kept; the least recently seen is forgotten first
  (it comes back full, which only favours that caller).

The settings travel from the launch profile to the API-server process as
``AGENTKV_CONTROL_*`` environment variables (:meth:`ControlLimit.to_env` /
:meth:`ControlLimit.from_env`, exact inverses). Pure apart from the clock, which is
injected; not thread-safe (the route runs on the API server's event loop).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from agentkv.protocol._wire import SALT_HEADER, valid_salt

__all__ = [
    "ENV_BURST",
    "ENV_RATE",
    "MAX_CALLERS",
    "ControlLimit",
    "TokenBuckets",
    "caller_key",
    "retry_after_header",
]

ENV_BURST = "AGENTKV_CONTROL_BURST"
ENV_RATE = "AGENTKV_CONTROL_RATE_PER_S"
MAX_CALLERS = 4096

_log = logging.getLogger("agentkv")
_KEY_SECRET = os.urandom(32)


@dataclass(frozen=True, slots=True)
class ControlLimit:
    """How many control requests one caller may send: ``burst`` at once, then
    ``rate_per_s`` (0: no limit)."""

    burst: int = 100
    rate_per_s: float = 50.0

    #: The variables that carry the limit to the API-server process.
    ENV_BURST: ClassVar[str] = ENV_BURST
    ENV_RATE: ClassVar[str] = ENV_RATE
    #: What the limit counts, in a warning about a malformed variable.
    WHAT: ClassVar[str] = "control requests"

    def __post_init__(self) -> None:
        if self.burst < 1 or not math.isfinite(self.rate_per_s) or self.rate_per_s < 0:
            raise ValueError(
                f"{self.WHAT} limit burst={self.burst}, rate_per_s={self.rate_per_s}: use a burst "
                "of at least 1 and a finite rate >= 0 (0 turns the limit off)"
            )

    @property
    def enabled(self) -> bool:
        """True when requests are limited at all."""
        return self.rate_per_s > 0

    def to_env(self) -> dict[str, str]:
        """The ``AGENTKV_*`` variables that carry this limit."""
        return {self.ENV_BURST: str(self.burst), self.ENV_RATE: repr(float(self.rate_per_s))}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ControlLimit:
        """The limit the environment names; a malformed value is logged and the default
        kept."""
        env = os.environ if env is None else env
        default = cls()
        burst, rate = default.burst, default.rate_per_s
        raw_burst, raw_rate = env.get(cls.ENV_BURST), env.get(cls.ENV_RATE)
        try:
            if raw_burst is not None:
                burst = int(raw_burst)
            if raw_rate is not None:
                rate = float(raw_rate)
            return cls(burst, rate)
        except ValueError:
            _log.warning(
                "ignoring %s=%r / %s=%r (a burst of at least 1, a finite rate >= 0); "
                "limiting %s to %d at once and %g per second",
                cls.ENV_BURST,
                raw_burst,
                cls.ENV_RATE,
                raw_rate,
                cls.WHAT,
                default.burst,
                default.rate_per_s,
            )
            return default


class TokenBuckets:
    """One token bucket per caller key, bounded to ``max_callers`` (LRU).

    ``take(key)`` spends one of the caller's tokens and returns 0.0, or, when the bucket
    holds less than one, spends nothing, counts the refusal in ``limited`` and returns the
    seconds until it holds one.
    """

    def __init__(
        self,
        limit: ControlLimit,
        *,
        max_callers: int = MAX_CALLERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.max_callers = max(1, max_callers)
        self.limited = 0
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str) -> float:
        """Spend one token of ``key``'s bucket: 0.0, or the wait in seconds when empty."""
        limit = self.limit
        if not limit.enabled:
            return 0.0
        now = self._clock()
        tokens, at = self._buckets.pop(key, (float(limit.burst), now))
        tokens = min(float(limit.burst), tokens + max(0.0, now - at) * limit.rate_per_s)
        wait_s = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            self.limited += 1
            wait_s = (1.0 - tokens) / limit.rate_per_s
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_callers:
            self._buckets.popitem(last=False)
        return wait_s


def _mac(kind: str, value: str) -> str:
    digest = hmac.new(_KEY_SECRET, f"{kind}\0{value}".encode(), hashlib.sha256).hexdigest()
    return f"{kind}:{digest[:32]}"


def caller_key(headers: Mapping[str, str], client_host: str | None) -> str:
    """Whose bucket a request spends: its bearer token, else the tenant scope it names,
    else its client address (each as a MAC; ``"anonymous"`` when none is known)."""
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token:
        return _mac("bearer", token)
    salt = headers.get(SALT_HEADER)
    if valid_salt(salt):
        return _mac("salt", str(salt))
    if client_host:
        return _mac("addr", client_host)
    return "anonymous"


def retry_after_header(wait_s: float) -> str:
    """The ``Retry-After`` value for a wait: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))
