"""The ``agentkv`` command line.

Each sub-command lives in its own module, imported only when that command runs, so
``agentkv --help`` stays fast and a command never pays for another's imports. A command
module provides ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from agentkv._version import __version__

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("agentkv._demo", "run the embedded-default benchmark demo (no GPU needed)"),
    "bench": ("agentkv.bench._cli", "replay agent traces against a real vLLM server, arm by arm"),
    "sim": ("agentkv.sim._cli", "simulate KV-cache policies on agent traces at any scale"),
    "serve": ("agentkv.vllm._cli", "start vLLM with the agentkv profile and scheduler plugin"),
    "lint": ("agentkv.prefix._cli", "find prefix-breaking problems in a JSONL of chat requests"),
    "gaps": ("agentkv.gaps._cli", "show or learn per-tool-class gap quantiles"),
}


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="agentkv",
        description="agentkv: KV-cache residency hints from agent harnesses to vLLM.",
    )
    parser.add_argument("--version", action="version", version=f"agentkv {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        # Sub-command arguments are added lazily in main(); --help of a sub-command
        # therefore imports only that command's module.
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentkv`` console script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Find the sub-command first so only its module is imported.
    command = next((a for a in args_list if not a.startswith("-")), None)
    if command in COMMANDS:
        module = importlib.import_module(COMMANDS[command][0])
        sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        module.add_arguments(sub_action.choices[command])
    args = parser.parse_args(args_list)
    # agentkv's own messages at INFO; other libraries' (httpx logs every request at INFO)
    # only when they warn, unless -v asks for everything.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("agentkv").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
