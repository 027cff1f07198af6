"""``agentkv serve [MODEL] [--host H] [--port P] [options] [-- extra vllm args]``.

Starts vLLM with the agentkv profile and keeps it running until Ctrl-C or SIGTERM.
Without MODEL it serves the tiny local model (built once under ``AGENTKV_HOME``).
Arguments after ``--`` go to vLLM unchanged and win over the profile's.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from agentkv._errors import AgentKVError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``serve`` options on ``parser``."""
    parser.add_argument("model", nargs="?", default=None, help="model id or path (default: tiny)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument("--kv-cache-memory-gib", type=float, default=None)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    parser.add_argument("--kv-offload-size-gib", type=float, default=None, help="GPU only")
    parser.add_argument("--kv-offload-backend", default="native", choices=["native", "lmcache"])
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--no-plugin", action="store_true", help="stock vLLM scheduler")
    parser.add_argument("--no-lifecycle-hints", action="store_true", help="no retain/release")
    parser.add_argument("--no-program-scheduling", action="store_true", help="no priority")
    parser.add_argument("--max-ttl-ms", type=int, default=600_000)
    parser.add_argument("--max-retained-fraction", type=float, default=0.5)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="readiness timeout")
    parser.add_argument(
        "--print-argv", action="store_true", help="print the vLLM command line and exit"
    )
    parser.set_defaults(vllm_args=[])
    parser.epilog = "Arguments after -- go to vLLM unchanged and win over the profile's."
    original = parser.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        # Everything after the first `--` is for vLLM, untouched by this parser.
        items = list(sys.argv[1:] if args is None else args)
        extra: list[str] = []
        if "--" in items:
            cut = items.index("--")
            items, extra = items[:cut], items[cut + 1 :]
        ns, rest = original(items, namespace)
        ns.vllm_args = extra
        return ns, rest

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def _options(args: argparse.Namespace) -> tuple[str | None, dict[str, Any]]:
    model = args.model
    extra = list(args.vllm_args)
    if model is not None and model.startswith("-"):  # `agentkv serve -- --x y`
        extra.insert(0, model)
        model = None
    plugin = not args.no_plugin
    opts: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "served_model_name": args.served_model_name,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "block_size": args.block_size,
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
        "kv_cache_memory_gib": args.kv_cache_memory_gib,
        "kv_cache_dtype": args.kv_cache_dtype,
        "kv_offload_size_gib": args.kv_offload_size_gib,
        "kv_offload_backend": args.kv_offload_backend,
        "enable_prefix_caching": not args.no_prefix_caching,
        "agentkv_plugin": plugin,
        "lifecycle_hints": plugin and not args.no_lifecycle_hints,
        "program_scheduling": plugin and not args.no_program_scheduling,
        "max_ttl_ms": args.max_ttl_ms,
        "max_retained_fraction": args.max_retained_fraction,
        "enforce_eager": args.enforce_eager,
        "api_key": args.api_key,
        "extra_args": extra,
    }
    return model, opts


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit status."""
    from agentkv.vllm._launch import prepare_profile, serve

    model, opts = _options(args)
    try:
        if args.print_argv:
            profile = prepare_profile(model, **opts)
            print(" ".join(profile.command()))
            return 0
        server = serve(model, timeout_s=args.timeout_s, **opts)
    except AgentKVError as exc:
        print(f"agentkv serve: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    print(
        f"agentkv serve: OpenAI API at {server.openai_base_url} (model {server.model!r}); "
        f"control route at {server.base_url}/agentkv/v1/; Ctrl-C stops",
        flush=True,
    )
    try:
        while not stop.is_set():
            if not server.running:
                print("agentkv serve: vLLM exited; last lines:\n" + server.logs[-3000:])
                return 1
            stop.wait(1.0)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        print("agentkv serve: stopping", flush=True)
        server.stop()
    return 0
