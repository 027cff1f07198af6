"""Render chat messages and tools to prompt text and token ids, the way vLLM does.

Prefix-cache reuse is decided on token ids, and the token ids come from the chat template
the server applies. To speak in tokens on the client side (lint, accounting), this module
applies the same template with a transformers tokenizer, after the same preprocessing
vLLM 0.32's OpenAI server does before rendering:

- text content parts are joined with ``"\\n"`` (``None`` content becomes ``""``);
- assistant ``tool_calls[].function.arguments`` strings are parsed into dicts (the
  template re-serializes them; invalid or non-object JSON becomes ``{}``);
- ``reasoning`` is passed as both ``reasoning`` and ``reasoning_content``;
- tools are rebuilt as ``{"type", "function": {"name", "description", "parameters",
  ["strict"]}}`` with ``None`` for a missing description or parameters.

transformers is imported only when a tokenizer is loaded by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError

__all__ = [
    "RenderedPrompt",
    "load_tokenizer",
    "render_divergence",
    "render_prompt",
    "to_vllm_messages",
    "to_vllm_tools",
]


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt as the server sees it: the template's text and its token ids."""

    text: str
    token_ids: list[int]

    @property
    def num_tokens(self) -> int:
        """Number of prompt tokens."""
        return len(self.token_ids)


def load_tokenizer(name_or_path: str | Path) -> Any:
    """Load a transformers tokenizer from a local model directory (no downloads).

    Raises:
        ConfigError: transformers is not installed or the directory has no tokenizer.
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError(
            "rendering prompts needs transformers: pip install 'agentkv-cache[cpu]'"
        ) from exc
    try:
        return AutoTokenizer.from_pretrained(str(name_or_path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, ...
        raise ConfigError(f"cannot load a tokenizer from {name_or_path}: {exc}") from exc


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise ConfigError(
                    "only text content parts can be rendered locally; "
                    f"got {part.get('type') if isinstance(part, Mapping) else type(part)}"
                )
        return "\n".join(texts)
    raise ConfigError(f"message content must be a string or a list of parts, got {content!r}")


def _parse_arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not arguments:
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def to_vllm_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return ``messages`` preprocessed as vLLM 0.32 does before applying the template."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        converted: dict[str, Any] = {"role": role, "content": _text_of(message.get("content"))}
        if isinstance(message.get("name"), str):
            converted["name"] = message["name"]
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls:
                rebuilt = []
                for call in calls:
                    call_dict = dict(call)
                    function = dict(call_dict.get("function") or {})
                    function["arguments"] = _parse_arguments(function.get("arguments"))
                    call_dict["function"] = function
                    rebuilt.append(call_dict)
                converted["tool_calls"] = rebuilt
            reasoning = message.get("reasoning")
            if reasoning is not None:
                converted["reasoning"] = reasoning
                converted["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            converted["tool_call_id"] = message["tool_call_id"]
        out.append(converted)
    return out


def to_vllm_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return OpenAI tool dicts as vLLM 0.32 hands them to the chat template."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise ConfigError("tools must be OpenAI tool dicts; pass them through stable_tools()")
        rebuilt_function: dict[str, Any] = {
            "name": function.get("name"),
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        for key in ("strict", "defer_loading"):
            if function.get(key) is not None:
                rebuilt_function[key] = function[key]
        rebuilt: dict[str, Any] = {"type": "function", "function": rebuilt_function}
        if tool.get("defer_loading") is not None:
            rebuilt["defer_loading"] = tool["defer_loading"]
        out.append(rebuilt)
    return out


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """Render a chat request to text and token ids as a vLLM 0.32 server would.

    ``tokenizer`` is a transformers tokenizer (or a local model directory to load one
    from). The text is the chat template's output; the ids are that text encoded without
    extra special tokens (the template adds them), which is what the server's
    ``/v1/chat/completions`` prefills and what ``/tokenize`` returns for the same body.

    Raises:
        ConfigError: the tokenizer has no chat template and none was given, a content
            part is not text, or transformers is missing.
    """
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(tokenizer)
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ConfigError("the tokenizer has no chat template; pass chat_template=...")
    kwargs = dict(chat_template_kwargs or {})
    kwargs.setdefault("add_generation_prompt", add_generation_prompt)
    text = tokenizer.apply_chat_template(
        to_vllm_messages(messages),
        tools=to_vllm_tools(tools) if tools else None,
        chat_template=chat_template,
        tokenize=False,
        **kwargs,
    )
    token_ids = list(tokenizer.encode(text, add_special_tokens=False))
    return RenderedPrompt(text=str(text), token_ids=token_ids)


def render_divergence(
    tokenizer: Any,
    before: tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None],
    after: tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None],
    *,
    before_generation_prompt: bool = True,
) -> tuple[int | None, int]:
    """Render two ``(messages, tools)`` requests; return ``(first differing token, len(before))``.

    The first element is ``None`` when the ``before`` prompt's tokens are a prefix of the
    ``after`` prompt's tokens (nothing of it is lost). ``before_generation_prompt=False``
    renders ``before`` without the assistant header, to compare the history alone.
    """
    a = render_prompt(
        tokenizer, before[0], before[1], add_generation_prompt=before_generation_prompt
    ).token_ids
    b = render_prompt(tokenizer, after[0], after[1]).token_ids
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i, len(a)
    return (None if len(a) <= len(b) else n), len(a)
