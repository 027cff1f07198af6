"""Scheduler-plugin settings, carried from the launcher to the engine-core process.

vLLM constructs the scheduler itself, in a child process, with a fixed set of
arguments; the plugin's own settings therefore travel as ``AGENTKV_SCHED_*``
environment variables, which the child inherits. :meth:`SchedSettings.to_env` and
:meth:`SchedSettings.from_env` are exact inverses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from agentkv.residency._settings import PolicySettings

__all__ = ["ENV_PREFIX", "MODES", "SchedSettings"]

ENV_PREFIX = "AGENTKV_SCHED_"
_log = logging.getLogger("agentkv")

#: The plugin's policy modes (see :attr:`SchedSettings.mode`).
MODES = ("act", "shadow", "off")


@dataclass(frozen=True)
class SchedSettings(PolicySettings):
    """What the scheduler plugin honours: the policy core's settings plus switches.

    ``lifecycle`` switches leases, release and the pressure override (benchmark arm E);
    ``program`` switches priority from hints, attained service and aging (arm F). The
    lease policy is the core's default: predicted retention with program-level admission
    (``retention="hint"``, ``admission=False``, ``max_retained_fraction=0.5`` is the
    first policy, still reachable; see ``docs/vllm.md``).
    """

    lifecycle: bool = True
    program: bool = True
    offload_reason: str = ""
    #: A request's own ``priority`` is client-set; under ``--scheduling-policy priority``
    #: it is clamped into ``[-max_client_priority, max_client_priority]`` so no client
    #: can jump every queue (agentkv's band and aging are relative to it).
    max_client_priority: int = 1000
    #: How the plugin starts: ``act`` applies its decisions, ``shadow`` makes and counts
    #: them while the engine behaves as stock vLLM, ``off`` is stock vLLM (the control
    #: route's ``POST /agentkv/v1/mode`` switches at run time).
    mode: str = "act"

    def to_env(self) -> dict[str, str]:
        """Encode as ``AGENTKV_SCHED_<FIELD>`` variables."""
        out: dict[str, str] = {}
        for key, value in asdict(self).items():
            if isinstance(value, bool):
                value = "1" if value else "0"
            out[ENV_PREFIX + key.upper()] = str(value)
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SchedSettings:
        """Decode from the environment; a malformed value is logged and the default kept."""
        env = os.environ if env is None else env
        kwargs: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            default = f.default
            try:
                if isinstance(default, bool):
                    kwargs[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    kwargs[f.name] = int(raw)
                elif isinstance(default, float):
                    kwargs[f.name] = float(raw)
                else:
                    kwargs[f.name] = raw
            except ValueError:
                _log.warning("ignoring %s%s=%r (not a number)", ENV_PREFIX, f.name.upper(), raw)
        if kwargs.get("retention", "hint") not in ("hint", "predicted"):
            _log.warning(
                "ignoring %sRETENTION=%r (hint or predicted)", ENV_PREFIX, kwargs["retention"]
            )
            del kwargs["retention"]
        if kwargs.get("mode", "act") not in MODES:
            _log.warning("ignoring %sMODE=%r (act, shadow or off)", ENV_PREFIX, kwargs["mode"])
            del kwargs["mode"]
        return cls(**kwargs)  # type: ignore[arg-type]
