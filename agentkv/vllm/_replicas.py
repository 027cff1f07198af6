"""Several vLLM replicas behind vllm-router on one port: :func:`serve_replicas`, :class:`ReplicaSet`.

Each replica is a :class:`~agentkv.vllm.Server` with the agentkv profile on its own port;
they start concurrently. In front of them runs the vLLM project's router (PyPI
``vllm-router``, a Rust extension behind a small Python launcher), started and stopped
like a server: its own process group, its own log file, ready when ``/health`` answers.

How a trajectory stays on one replica (measured with vllm-router 0.1.17):

- ``consistent_hash`` keys on the first non-empty header of ``X-Session-ID``,
  ``X-User-ID``, ``X-Tenant-ID``, ``X-Correlation-ID``, ``X-Request-ID``, ``X-Trace-ID``.
  agentkv's client sets ``X-Session-ID`` to the trajectory id on every model call, so all
  turns of a trajectory land on one replica. Without such a header a chat request has an
  empty key and every one of them goes to the same replica. With a dozen trajectories
  the hash can put two thirds of them on one replica.
- The default policy is ``sticky_least_loaded``: the first request of a session key
  pins it to the replica with the fewest pinned sessions, and it stays there until
  ``POST /finish_session?session_id=<key>`` (agentkv's client sends it when a trajectory
  ends) or until it sat idle longer than ``VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S``
  (set to :data:`SESSION_EXPIRATION_S` unless the environment already has it).
- The router forwards paths it does not know (``/agentkv/v1/*``) to the replica its policy
  picks: with ``X-Session-ID`` set to the trajectory id, a lifecycle POST or a residency
  query reaches the replica that holds the trajectory. That forwarding drops the client's
  headers, ``Authorization`` included, so replicas started with an API key refuse it;
  :attr:`ReplicaSet.replica_urls` lets a caller talk to a replica directly instead.
- The router keeps the request body (it re-serializes it and adds default fields vLLM
  ignores): flat ``vllm_xargs`` keys, ``session_id``, ``cache_salt`` and ``priority`` arrive
  as sent.

The handle reports the plugin counters per replica and summed (:meth:`ReplicaSet.get_stats`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from agentkv._errors import ServeError
from agentkv.vllm._devices import replica_device_env
from agentkv.vllm._fanout import combine_stats
from agentkv.vllm._launch import (
    Server,
    find_free_port,
    local_host,
    log_tail,
    prepare_profile,
    start_server,
    stderr_progress,
    stop_process_group,
)

__all__ = [
    "DEFAULT_ROUTER_POLICY",
    "ROUTER_KEY_ENV",
    "ROUTER_POLICIES",
    "SESSION_EXPIRATION_S",
    "ReplicaSet",
    "keyed_router",
    "router_command",
    "serve_replicas",
]

#: Request-level policies of vllm-router 0.1.17 that need no extra setup.
ROUTER_POLICIES = (
    "sticky_least_loaded",
    "consistent_hash",
    "round_robin",
    "random",
    "power_of_two",
    "cache_aware",
)

#: The policy :func:`serve_replicas` starts by default.
DEFAULT_ROUTER_POLICY = "sticky_least_loaded"

#: Idle seconds after which ``sticky_least_loaded`` forgets a session (and may place its
#: next request elsewhere). An hour: longer than any tool gap worth keeping KV for; an
#: ended trajectory is forgotten at once through ``/finish_session``.
SESSION_EXPIRATION_S = 3600
SESSION_EXPIRATION_ENV = "VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"
ROUTER_INSTALL_HINT = "install the router with: pip install 'agentkv-cache[router]' (or vllm-router)"
BIND_ATTEMPTS = 3  # router starts tried when a port it needs turns out to be taken
ADDRESS_IN_USE = "Address already in use"


class _PortTaken(ServeError):
    """The router stopped at start because its port or its metrics port was in use."""


def _router_executable() -> list[str]:
    exe = shutil.which("vllm-router")
    if exe:
        return [exe]
    if importlib.util.find_spec("vllm_router") is not None:
        return [sys.executable, "-m", "vllm_router.launch_router"]
    raise ServeError(f"vllm-router is not installed; {ROUTER_INSTALL_HINT}")


logger = logging.getLogger("agentkv")

#: The router's API key travels in this variable, never on its command line (``ps``
#: shows every process's argv to every user of the machine).
ROUTER_KEY_ENV = "AGENTKV_ROUTER_API_KEY"

# Runs vllm-router's own launcher with the key taken from the environment: the process's
# visible argv is this code, which holds no secret.
_KEYED_LAUNCH = (
    "import os, sys; from vllm_router.launch_router import main; "
    f"sys.argv += ['--api-key', os.environ.pop({ROUTER_KEY_ENV!r})]; main()"
)


def keyed_router(command: Sequence[str], key: str) -> tuple[list[str], dict[str, str]] | None:
    """``command`` (from :func:`router_command`, without the key) run so the router gets
    ``key`` from its environment; None where vllm-router's launcher cannot be imported
    by this Python (a custom executable): then the key can only go on the command line."""
    if importlib.util.find_spec("vllm_router") is None:
        return None
    flags = list(command)[list(command).index("--host") :]
    return [sys.executable, "-c", _KEYED_LAUNCH, *flags], {ROUTER_KEY_ENV: key}


def router_command(
    worker_urls: Sequence[str],
    *,
    host: str,
    port: int,
    prometheus_port: int,
    policy: str = DEFAULT_ROUTER_POLICY,
    extra_args: Sequence[str] = (),
    executable: Sequence[str] | None = None,
) -> list[str]:
    """The router's command line (pure apart from locating the executable).

    Logs at ``warning``: at ``info`` the router writes several lines per request. The
    Prometheus port is always explicit, because the router binds its default (29000)
    otherwise and two routers on one machine would collide.
    """
    return [
        *(executable if executable is not None else _router_executable()),
        "--host", host,
        "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(prometheus_port),
        "--worker-startup-check-interval", "1",
        "--log-level", "warning",
        *extra_args,
    ]  # fmt: skip


class ReplicaSet:
    """N vLLM replicas behind vllm-router (context manager: leaving the block stops all).

    ``base_url`` and ``openai_base_url`` are the router's; ``replica_urls`` are the
    replicas' roots (each also serves the OpenAI API and the control route);
    ``servers`` are their :class:`Server` handles; ``model`` is the name to put in requests.
    :meth:`restart_router` puts a router with another policy or flags in front of the same
    replicas (on the same port). With ``port=None`` the router gets a free port when it
    first starts, and another free one if that start finds the port taken.
    """

    def __init__(
        self,
        servers: Sequence[Server],
        *,
        host: str,
        port: int | None,
        log_dir: Path,
        api_key: str | None = None,
        executable: Sequence[str] | None = None,
    ) -> None:
        self.servers = list(servers)
        self.router: subprocess.Popen[bytes] | None = None
        self.router_log_path = log_dir / "router.log"
        self.policy = ""
        self._host = host
        self._api_key = api_key
        self._executable = list(executable) if executable is not None else None
        self._port_movable = port is None  # until the router first answers on it
        self._set_port(port if port is not None else find_free_port(host))
        self.router_metrics_url = ""
        self.replica_urls = [s.base_url for s in self.servers]
        self.model = self.servers[0].model
        self.start_time_s: float | None = None
        self.router_argv: list[str] = []  # the router's command line (API key masked)
        self.replica_env: list[dict[str, str]] = []  # each replica's device variables

    def start_router(
        self,
        policy: str = DEFAULT_ROUTER_POLICY,
        extra_args: Sequence[str] = (),
        timeout_s: float = 120.0,
    ) -> None:
        """Start vllm-router in front of the replicas and wait until it answers.

        With an API key the router gets it too (it authenticates to the replicas with it).
        A start that finds its port or its metrics port taken is tried again, up to
        ``BIND_ATTEMPTS`` times, on a fresh port where the port was drawn (``port=None``)
        and the router never ran on it. Raises :class:`~agentkv.ServeError` (the router
        stopped again) when it does not come up.
        """
        if self.router is not None and self.router.poll() is None:
            raise ServeError("the router is already running; use restart_router()")
        for attempt in range(BIND_ATTEMPTS):
            try:
                self._launch_router(policy, extra_args, timeout_s)
                break
            except _PortTaken:
                if attempt == BIND_ATTEMPTS - 1:
                    raise
                if self._port_movable:
                    self._set_port(find_free_port(self._host))
                time.sleep(0.5 * (attempt + 1))
        self._port_movable = False

    def _set_port(self, port: int) -> None:
        self.port = port
        self.base_url = f"http://{local_host(self._host)}:{port}"
        self.openai_base_url = self.base_url + "/v1"

    def _launch_router(self, policy: str, extra_args: Sequence[str], timeout_s: float) -> None:
        """One start of the router; raises :class:`_PortTaken` when a port was in use."""
        prometheus_port = find_free_port()
        key = self._api_key
        command = router_command(
            self.replica_urls,
            host=self._host,
            port=self.port,
            prometheus_port=prometheus_port,
            policy=policy,
            extra_args=extra_args,
            executable=self._executable,
        )
        env = dict(os.environ)
        env.setdefault(SESSION_EXPIRATION_ENV, str(SESSION_EXPIRATION_S))
        if key:
            keyed = keyed_router(command, key) if self._executable is None else None
            if keyed is not None:
                command, extra_env = keyed
                env.update(extra_env)
            else:
                logger.warning(
                    "agentkv: the router's API key goes on its command line (readable by "
                    "other users with ps): vllm-router's launcher is not importable here"
                )
                command = [*command, "--api-key", key]
        with self.router_log_path.open("ab") as log:
            log_start = len(self.logs)
            self.router = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )  # fmt: skip
        self.policy = policy
        self.router_metrics_url = f"http://127.0.0.1:{prometheus_port}/metrics"
        self.router_argv = [a if a != key else "<api key>" for a in command]
        try:
            self.wait_ready(timeout_s=timeout_s)
        except BaseException as exc:
            self.stop_router(timeout_s=10)
            if isinstance(exc, ServeError) and ADDRESS_IN_USE in self.logs[log_start:]:
                raise _PortTaken(str(exc)) from exc
            raise

    def stop_router(self, timeout_s: float = 30.0) -> None:
        """Stop the router (the replicas keep running)."""
        if self.router is not None:
            stop_process_group(self.router, timeout_s)

    def restart_router(
        self, policy: str = DEFAULT_ROUTER_POLICY, extra_args: Sequence[str] = ()
    ) -> None:
        """Replace the router by one with ``policy`` and ``extra_args``, same port."""
        self.stop_router()
        self.start_router(policy, extra_args)

    @property
    def logs(self) -> str:
        """What the router has written so far (each replica's log is on its Server)."""
        try:
            return self.router_log_path.read_text("utf-8", errors="replace")
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        """True while the router and every replica are alive."""
        router_up = self.router is not None and self.router.poll() is None
        return router_up and all(s.running for s in self.servers)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the router's ``/health`` answers 200; raise ServeError otherwise."""
        import httpx

        start = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.router.poll() if self.router is not None else -1
                if code is not None:
                    raise ServeError(
                        f"vllm-router exited with status {code} before it was ready (log: "
                        f"{self.router_log_path}). Last lines:\n{log_tail(self.logs)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.base_url + "/health").status_code == 200:
                        # Something else may answer on a taken port while ours is failing.
                        time.sleep(0.2)
                        if self.router is not None and self.router.poll() is None:
                            self.start_time_s = time.monotonic() - start
                            return
                if time.monotonic() - start > timeout_s:
                    raise ServeError(
                        f"vllm-router was not ready after {timeout_s:.0f} s (log: "
                        f"{self.router_log_path}). Last lines:\n{log_tail(self.logs)}"
                    )
                time.sleep(0.25)

    def get_stats(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The plugin counters of every replica, read directly, and their sum.

        Returns ``{"replicas": {url: stats}, "total": {...}}``; a replica that did not
        answer has ``{"error": "..."}`` in place of its stats.
        """
        import httpx

        per: dict[str, dict[str, Any]] = {}
        with httpx.Client(timeout=timeout_s) as client:
            for url in self.replica_urls:
                try:
                    response = client.get(url + "/agentkv/v1/stats")
                    if response.status_code == 200:
                        per[url] = dict(response.json())
                    else:
                        per[url] = {"error": f"HTTP {response.status_code}"}
                except (httpx.HTTPError, ValueError) as exc:
                    per[url] = {"error": type(exc).__name__}
        return {"replicas": per, "total": combine_stats(list(per.values()))}

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the router, then every replica (SIGTERM, then SIGKILL after ``timeout_s``)."""
        self.stop_router(timeout_s)
        with concurrent.futures.ThreadPoolExecutor(max(1, len(self.servers))) as pool:
            list(pool.map(lambda s: s.stop(timeout_s=timeout_s), self.servers))

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"ReplicaSet({self.base_url!r}, replicas={len(self.servers)}, "
            f"policy={self.policy!r}, {state})"
        )


def _tensor_parallel_size(args: Sequence[str]) -> int:
    """``--tensor-parallel-size`` (or ``-tp``) among vLLM pass-through args, else 1."""
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in ("--tensor-parallel-size", "-tp"):
            if not value and i + 1 < len(args):
                value = args[i + 1]
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    return 1


def _devices_line(envs: Sequence[dict[str, str]]) -> str:
    return "replica devices: " + "; ".join(
        f"{i}: " + ", ".join(f"{k}={v}" for k, v in env.items()) for i, env in enumerate(envs)
    )


def _start_replicas(
    model: str | None,
    replicas: int,
    *,
    timeout_s: float,
    logs: Path,
    options: dict[str, Any],
    ports: Sequence[int] | None = None,
    envs: Sequence[dict[str, str]] = (),
) -> list[Server]:
    """Start the replicas concurrently; on any failure stop those that started.

    ``envs``: each replica's extra environment variables (its devices), on top of the
    profile's ``extra_env``.
    """

    def start(i: int) -> Server:
        opts = dict(options)
        if ports is not None:
            opts["port"] = ports[i]
        if i < len(envs) and envs[i]:
            opts["extra_env"] = {**opts.get("extra_env", {}), **envs[i]}
        return start_server(
            model, timeout_s=timeout_s, progress=None, log_path=logs / f"replica-{i}.log", **opts
        )

    servers: list[Server] = []
    errors: list[BaseException] = []
    with concurrent.futures.ThreadPoolExecutor(replicas) as pool:
        for future in [pool.submit(start, i) for i in range(replicas)]:
            try:
                servers.append(future.result())
            except BaseException as exc:  # keep collecting, so every started server is stopped
                errors.append(exc)
    if errors:
        for server in servers:
            server.stop(timeout_s=10)
        raise ServeError(f"{len(errors)} of {replicas} replicas did not start: {errors[0]}")
    return servers


def serve_replicas(
    model: str | None = None,
    *,
    replicas: int,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = stderr_progress,
    log_dir: str | os.PathLike[str] | None = None,
    router_policy: str = DEFAULT_ROUTER_POLICY,
    router_args: Sequence[str] = (),
    replica_ports: Sequence[int] | None = None,
    **options: Any,
) -> ReplicaSet:
    """Start ``replicas`` vLLM servers with the agentkv profile and vllm-router in front.

    ``options`` are :class:`ServeProfile` fields shared by every replica, except ``host``
    and ``port``, which are the router's (each replica gets a free port on ``host``, or
    its entry of ``replica_ports``: the router's hash ring is built from the replicas'
    URLs, so fixed ports give the same trajectory-to-replica mapping in every run).
    With ``api_key`` the router is given the key too (it authenticates to the replicas
    with it). Logs go to ``log_dir`` (``replica-<i>.log``, ``router.log``), by default a
    new temporary directory. Raises :class:`~agentkv.ServeError` when a replica or the
    router does not come up; whatever had started is stopped first.
    """
    if replicas < 1:
        raise ServeError(f"replicas={replicas}: ask for at least one replica")
    if replica_ports is not None and len(replica_ports) != replicas:
        raise ServeError(f"replica_ports has {len(replica_ports)} ports for {replicas} replicas")
    executable = _router_executable()  # fail before starting any vLLM
    host = str(options.pop("host", None) or "127.0.0.1")
    # The router's port is drawn once the replicas are up: a port drawn a minute earlier
    # may be in use by then.
    port = int(options.pop("port", None) or 0) or None
    # Validate the options and build an embedded model once, before N threads need it.
    resolved = prepare_profile(model, host=host, **options)
    if model != resolved.model:
        model = str(resolved.model)
        if options.get("served_model_name") is None:
            options["served_model_name"] = resolved.served_model_name
    # Each replica's KV space is what the profile's pool needs (on CPU, not a share of
    # the node's memory): the size prepare_profile chose travels to every replica (an
    # option given as None, as the CLI passes unset flags, must not mask it).
    if options.get("kv_cache_memory_gib") is None and resolved.kv_cache_memory_gib is not None:
        options["kv_cache_memory_gib"] = resolved.kv_cache_memory_gib
    if options.get("kv_offload_size_gib") is None and resolved.kv_offload_size_gib is not None:
        options["kv_offload_size_gib"] = resolved.kv_offload_size_gib
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="agentkv-replicas-"))
    logs.mkdir(parents=True, exist_ok=True)
    envs, shared = replica_device_env(
        str(resolved.platform),
        replicas,
        extra_env=resolved.extra_env,
        tensor_parallel_size=_tensor_parallel_size(resolved.extra_args),
    )
    if progress:
        progress(
            f"starting {replicas} vLLM replicas and vllm-router ({router_policy}); logs: {logs}"
        )
        progress(f"replicas share devices: {shared}" if shared else _devices_line(envs))
    servers = _start_replicas(
        model,
        replicas,
        timeout_s=timeout_s,
        logs=logs,
        options={"host": host, "extra_env": dict(resolved.extra_env), **options},
        ports=replica_ports,
        envs=envs,
    )
    replica_set = ReplicaSet(
        servers, host=host, port=port, log_dir=logs, api_key=resolved.api_key,
        executable=executable,
    )  # fmt: skip
    replica_set.replica_env = [dict(env) for env in envs]
    try:
        replica_set.start_router(router_policy, router_args, timeout_s=min(timeout_s, 120.0))
    except BaseException:
        replica_set.stop(timeout_s=10)
        raise
    if progress:
        progress(
            f"router at {replica_set.base_url} in front of {', '.join(replica_set.replica_urls)}"
        )
    return replica_set
