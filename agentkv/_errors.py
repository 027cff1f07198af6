"""The agentkv exception tree.

agentkv raises only at explicit setup points (``configure``, ``serve``, profile
validation, parsing user-supplied files). Every exception derives from
:class:`AgentKVError`, and every message says what to do next.
"""

from __future__ import annotations

__all__ = [
    "AgentKVError",
    "ConfigError",
    "ModelSourceError",
    "ServeError",
    "TenantIsolationError",
    "ToolSchemaError",
    "TraceFormatError",
    "VLLMNotInstalledError",
]


class AgentKVError(Exception):
    """Base class of every error agentkv raises on purpose."""


class ConfigError(AgentKVError, ValueError):
    """A setting passed to ``configure`` or read from ``AGENTKV_*`` is invalid."""


class ToolSchemaError(AgentKVError, ValueError):
    """A tool given to ``stable_tools`` cannot be turned into a stable schema."""


class TraceFormatError(AgentKVError, ValueError):
    """A trace file does not follow the agentkv trace format (line and field named)."""


class ServeError(AgentKVError, RuntimeError):
    """The vLLM server could not be started, or died; the message carries its log tail."""


class ModelSourceError(ServeError):
    """The files an embedded model is built from cannot be found or fetched.

    The message names the command that fetches them, or the setting that points at them.
    """


class VLLMNotInstalledError(ServeError):
    """vLLM is not importable; the message names the install command."""


class TenantIsolationError(AgentKVError, RuntimeError):
    """A call of a trajectory with a tenant could not carry the tenant's cache salt.

    The salt is cache identity (tenants must not share prefix KV), so the call is not
    sent without it; the message names the reason and the setting that allows it
    (``ClientOptions(allow_unsalted=True)``).
    """
