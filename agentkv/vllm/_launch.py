"""Start and stop a vLLM server with the agentkv profile: :func:`start_server`, :class:`Server`.

The server runs as ``python -m vllm.entrypoints.openai.api_server`` in its own process
group (so stopping it stops vLLM's engine-core and worker children too), with its
output in a log file. :func:`start_server` returns once ``/health`` answers, or raises
:class:`~agentkv.ServeError` carrying the end of the log.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from agentkv._errors import ServeError, VLLMNotInstalledError
from agentkv.models import (
    SMOLLM2_MODEL_NAME,
    TINY_MODEL_NAME,
    embedded_model_name,
    ensure_embedded_model,
)
from agentkv.vllm._profile import ServeProfile

__all__ = [
    "TINY_MODEL_NAME",
    "Server",
    "find_free_port",
    "local_host",
    "log_tail",
    "require_vllm",
    "start_server",
    "stderr_progress",
    "stop_process_group",
]

INSTALL_HINT = (
    "install vLLM with: pip install 'agentkv-cache[cpu]' (CPU build; or scripts/install.sh), "
    "or pip install 'agentkv-cache[vllm]' on a machine with an NVIDIA GPU"
)


def local_host(host: str) -> str:
    """The address a local client reaches ``host`` at (a wildcard bind means loopback)."""
    return host if host not in ("0.0.0.0", "", "::") else "127.0.0.1"


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port the kernel hands out for bind-to-0 and outgoing connections."""
    try:
        return max(2048, int(Path(path).read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts there


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago.

    It is drawn below the kernel's ephemeral range when one is free there: a port from
    that range (what binding to port 0 gives) can be handed to another process's outgoing
    connection or internal socket before the server that was meant to get it binds it
    (vLLM's engine starts for a minute and opens such sockets), which makes a start fail
    with "Address already in use". Falls back to binding port 0.
    """
    host = local_host(host)
    high = _ephemeral_low()
    low = max(1024, high - 12768)
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(low, high)
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stderr_progress(message: str) -> None:
    """The default progress callback: one ``agentkv serve:`` line on stderr."""
    print(f"agentkv serve: {message}", file=sys.stderr, flush=True)


def stop_process_group(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int | None:
    """SIGTERM to ``process``'s group, SIGKILL after ``timeout_s``; returns its exit status.

    Children started in the group (vLLM's engine core and workers) are killed too, so
    none is left behind.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.returncode


def log_tail(text: str, lines: int = 40) -> str:
    """The last ``lines`` lines of a log text."""
    return "\n".join(text.splitlines()[-lines:])


class Server:
    """A running vLLM server (context manager: leaving the block stops it).

    ``base_url`` is the server root (``http://127.0.0.1:PORT``); the OpenAI API is at
    ``openai_base_url`` (``base_url + "/v1"``) and the control route under
    ``base_url + "/agentkv/v1/"``. ``model`` is the name to put in requests.
    """

    def __init__(self, profile: ServeProfile, process: subprocess.Popen[bytes], log_path: Path):
        self.profile = profile
        self.process = process
        self.log_path = log_path
        self.base_url = f"http://{local_host(profile.host)}:{profile.port}"
        self.openai_base_url = self.base_url + "/v1"
        self.model = profile.served_model_name or str(profile.model)
        self.start_time_s: float | None = None

    @property
    def logs(self) -> str:
        """Everything the server has written so far (stdout and stderr)."""
        try:
            return self.log_path.read_text("utf-8", errors="replace")
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self.process.poll() is None

    def wait_ready(
        self, timeout_s: float = 600.0, progress: Callable[[str], None] | None = stderr_progress
    ) -> None:
        """Block until ``/health`` answers 200; raise ServeError on exit or timeout."""
        import httpx

        start = time.monotonic()
        next_note = start + 10.0
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    tail = log_tail(self.logs)
                    advice = f"\n{CPU_MEMORY_ADVICE}" if _memory_short(tail) else ""
                    raise ServeError(
                        f"vLLM exited with status {code} before it was ready "
                        f"(full log: {self.log_path}). Last lines:\n{tail}{advice}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.base_url + "/health").status_code == 200:
                        self.start_time_s = time.monotonic() - start
                        if progress:
                            progress(f"ready at {self.base_url} in {self.start_time_s:.0f} s")
                        return
                now = time.monotonic()
                if now - start > timeout_s:
                    tail = log_tail(self.logs)
                    self.stop()
                    raise ServeError(
                        f"vLLM was not ready after {timeout_s:.0f} s (raise timeout_s, or check "
                        f"the log {self.log_path}). Last lines:\n{tail}"
                    )
                if progress and now >= next_note:
                    last = log_tail(self.logs, 1).strip()[:160]
                    progress(f"waiting for vLLM ({now - start:.0f} s) ... {last}")
                    next_note = now + 10.0
                time.sleep(0.5)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Stop the server: SIGTERM to its process group, then SIGKILL after ``timeout_s``."""
        return stop_process_group(self.process, timeout_s)

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited({self.process.returncode})"
        return f"Server({self.base_url!r}, model={self.model!r}, {state})"


def _memory_short(log: str) -> bool:
    """Did a CPU server die for want of memory on its node?"""
    return "less than desired CPU memory utilization" in log or (
        "Available memory on node" in log and "less than requested memory" in log
    )


def require_vllm() -> None:
    """Raise :class:`~agentkv.VLLMNotInstalledError` unless a vLLM build is installed."""
    from agentkv.vllm._platform import vllm_distribution

    if vllm_distribution() is None:
        raise VLLMNotInstalledError(f"vLLM is not installed; {INSTALL_HINT}")


#: KV cache size an embedded model (the tiny one, SmolLM2) gets on CPU unless told otherwise.
TINY_MODEL_KV_GIB = 2.0

#: What to change when a CPU server's memory is short (appended to its start error).
CPU_MEMORY_ADVICE = (
    "vLLM's CPU build reserves --gpu-memory-utilization (default 0.92) of the NUMA node's "
    "memory unless the KV space is given: pass --kv-cache-memory-gib N (kv_cache_memory_gib) "
    "or --num-gpu-blocks-override N (the KV space is then sized from the pool), lower "
    "--gpu-memory-utilization, start fewer replicas, or free memory used by other processes"
)


def cpu_kv_cache_gib(profile: ServeProfile, model_dir: str | None) -> float | None:
    """The KV space a CPU server needs, in whole GiB (``VLLM_CPU_KVCACHE_SPACE`` is an
    integer), from the pool the profile asks for: ``num_gpu_blocks_override`` blocks of
    ``block_size`` tokens at the model's KV bytes per token (read from ``model_dir``'s
    config.json), plus one GiB of slack for vLLM's rounding; None when the profile asks
    for no pool or the model's KV size cannot be read (vLLM then takes a share of the
    node's memory). An explicit KV space (``kv_cache_memory_gib``) or a share of memory
    (``gpu_memory_utilization``) is left alone."""
    if profile.kv_cache_memory_gib is not None or profile.gpu_memory_utilization is not None:
        return None
    if profile.num_gpu_blocks_override is None or model_dir is None:
        return None
    from agentkv._errors import ConfigError as _ConfigError
    from agentkv.advice._kvsize import kv_bytes_per_token

    try:
        per_token = kv_bytes_per_token(model_dir, kv_dtype=profile.kv_cache_dtype)
    except _ConfigError:
        return None
    tokens = profile.num_gpu_blocks_override * profile.effective_block_size()
    return float(math.ceil(tokens * per_token / 2**30) + 1)


logger = logging.getLogger("agentkv")


def public_bind_warning(host: str, api_key: str | None) -> str | None:
    """What to say when a server binds beyond this machine without an API key (None:
    nothing to say): anyone who reaches the port could then send requests, read and
    post to the control route, and scrape ``/metrics``."""
    if api_key or os.environ.get("VLLM_API_KEY"):
        return None
    name = host.strip().strip("[]")
    if name == "localhost":
        return None
    try:
        if ipaddress.ip_address(name).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve beyond loopback
    return (
        f"agentkv: serving on {host} without an API key: anyone who can reach the port "
        "can send requests and lifecycle events and read /metrics; pass --api-key (or "
        "set VLLM_API_KEY), or bind 127.0.0.1"
    )


def prepare_profile(model: str | None = None, **options: Any) -> ServeProfile:
    """Build the resolved profile :func:`serve` would start (model and port filled in)."""
    profile = options.pop("profile", None)
    if profile is None:
        profile = ServeProfile(model=model, **options)
    else:
        if not isinstance(profile, ServeProfile):
            raise TypeError("profile must be a ServeProfile")
        updates = dict(options)
        if model is not None:
            updates["model"] = model
        profile = ServeProfile(**{**profile.model_dump(exclude_unset=True), **updates})
    profile = profile.resolve()
    data = profile.model_dump(exclude_unset=True)
    embedded = embedded_model_name(profile.model)  # None -> the tiny model
    if embedded is not None:
        data["model"] = str(ensure_embedded_model(embedded))
        data["served_model_name"] = profile.served_model_name or embedded
        if embedded == SMOLLM2_MODEL_NAME and "dtype" not in data and profile.platform == "cpu":
            # Its weights are stored in float32; served in vLLM's CPU default bfloat16 it
            # answers "What is the capital of France?" with noise, in float32 with Paris.
            data["dtype"] = "float32"
        if (
            profile.platform == "cpu"
            and profile.kv_cache_memory_gib is None
            and profile.gpu_memory_utilization is None
        ):
            # vLLM's CPU default claims 92% of host memory for KV; an embedded model needs
            # a sliver, and a fixed size starts even on a machine that is partly in use.
            data["kv_cache_memory_gib"] = TINY_MODEL_KV_GIB
    if profile.platform != "cpu" and profile.kv_offload and profile.kv_offload_size_gib is None:
        from agentkv.vllm._offload import size_offload_tier

        sizing = size_offload_tier(
            str(data["model"]),
            kv_cache_dtype=profile.kv_cache_dtype,
            max_model_len=profile.effective_max_model_len(),
            max_num_seqs=profile.max_num_seqs,
            trajectories=profile.kv_offload_trajectories,
            context_tokens=profile.kv_offload_context_tokens,
        )
        if sizing is not None:
            data["kv_offload_size_gib"] = sizing.size_gib
    if profile.platform == "cpu" and data.get("kv_cache_memory_gib") is None:
        model_dir = str(data["model"]) if data.get("model") else None
        gib = cpu_kv_cache_gib(profile, model_dir)
        if gib is not None:
            data["kv_cache_memory_gib"] = gib
    if not profile.port:
        data["port"] = find_free_port(profile.host)
    warning = public_bind_warning(profile.host, profile.api_key)
    if warning is not None:
        logger.warning(warning)
    return ServeProfile(**data)


def start_server(
    model: str | None = None,
    *,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = stderr_progress,
    log_path: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Server:
    """Start vLLM with the agentkv profile and return a ready :class:`Server`.

    ``model`` is a Hugging Face id or local path, or an embedded model's name
    (``"smollm2"``: SmolLM2-135M-Instruct); None serves the tiny local model. Embedded
    models are built once under ``AGENTKV_HOME/models``. ``options`` are :class:`ServeProfile`
    fields (or ``profile=ServeProfile(...)``). A free port is picked unless ``port``
    is given. Raises :class:`~agentkv.VLLMNotInstalledError` without vLLM and
    :class:`~agentkv.ServeError` (with the log tail) when the server does not come up.
    """
    require_vllm()
    profile = prepare_profile(model, **options)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"agentkv-serve-{profile.port}-", suffix=".log")
        os.close(fd)
        path = Path(name)
    else:
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **profile.env(), "PYTHONUNBUFFERED": "1"}
    if progress:
        progress(f"starting vLLM ({profile.model}) on port {profile.port}; log: {path}")
    with path.open("wb") as log:
        process = subprocess.Popen(
            profile.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    server = Server(profile, process, path)
    try:
        server.wait_ready(timeout_s=timeout_s, progress=progress)
    except BaseException:
        server.stop(timeout_s=10)
        raise
    return server
