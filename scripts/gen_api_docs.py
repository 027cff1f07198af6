"""Generate docs/api.md from the docstrings of agentkv's public API.

Usage::

    python scripts/gen_api_docs.py            # write docs/api.md
    python scripts/gen_api_docs.py --check    # exit 1 if docs/api.md is out of date

The public API is ``agentkv.__all__`` plus the integration modules, ``agentkv.testing`` and
``agentkv.workload``. Only names and docstrings are read (``inspect``); nothing is executed
beyond importing the modules.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "api.md"
MODULES = [
    "agentkv.integrations.langgraph",
    "agentkv.integrations.openai_agents",
    "agentkv.testing",
    "agentkv.workload",
]

HEADER = """# API reference

Generated from the docstrings by `python scripts/gen_api_docs.py`; do not edit by hand.
Guides: [quickstart](quickstart.md), [concepts](concepts.md), [integrations](integrations.md),
[guides](guides.md), [troubleshooting](troubleshooting.md).
"""


def _signature(obj: Any) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    # Default values that are objects print with their memory address: drop it so the
    # page is the same on every run.
    sig = re.sub(r" at 0x[0-9a-fA-F]+>", ">", sig)
    return sig if len(sig) < 400 else "(...)"


def _doc(obj: Any) -> str:
    return inspect.cleandoc(inspect.getdoc(obj) or "(no docstring)")


def _public_methods(cls: type) -> list[tuple[str, Any]]:
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        out.append((name, member))
    return out


def _entry(name: str, obj: Any, level: str = "###") -> list[str]:
    if inspect.isclass(obj):
        lines = [f"{level} `class {name}{_signature(obj)}`", "", _doc(obj), ""]
        for meth_name, member in _public_methods(obj):
            target = member.fget if isinstance(member, property) else member
            kind = "property " if isinstance(member, property) else ""
            sig = "" if kind else _signature(target)
            first = _doc(target).split("\n\n")[0]
            lines.append(f"- `{kind}{meth_name}{sig}`: {first}")
        if lines[-1] != "":
            lines.append("")
        return lines
    if callable(obj):
        return [f"{level} `{name}{_signature(obj)}`", "", _doc(obj), ""]
    return [f"{level} `{name}`", "", f"`{obj!r}`"[:300], ""]


def render() -> str:
    """The whole page as a string."""
    import agentkv

    lines = [HEADER, "## `agentkv`", ""]
    for name in sorted(agentkv.__all__):
        if name == "__version__":
            continue
        lines += _entry(f"agentkv.{name}", getattr(agentkv, name))
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", "", _doc(module).split("\n\n")[0], ""]
        for name in sorted(getattr(module, "__all__", [])):
            lines += _entry(f"{module_name}.{name}", getattr(module, name))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="generate docs/api.md from docstrings")
    parser.add_argument("--check", action="store_true", help="fail if docs/api.md is stale")
    parser.add_argument("--out", default=str(OUT), help="output file (default docs/api.md)")
    args = parser.parse_args(argv)
    text = render()
    out = Path(args.out)
    if args.check:
        current = out.read_text("utf-8") if out.exists() else ""
        if current != text:
            print(f"{out} is out of date: run python scripts/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, "utf-8")
    print(f"wrote {out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
