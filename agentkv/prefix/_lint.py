"""Prompt-layout lint: find what keeps a prompt prefix from being reused.

A prefix cache (vLLM's, OpenAI's, Anthropic's) serves a request only up to the first
token that differs from a cached prompt. :func:`lint_prompt` looks at one chat request —
and, given the previous request of the same conversation, at the pair — and reports:

- ``volatile_content``: values that change from run to run (timestamps, dates, UUIDs,
  request ids, PIDs, temporary paths, random hex) inside the stable prefix (the system
  prompt and the tool descriptions);
- ``tools_not_canonical``: a tool list that is not in :func:`agentkv.stable_tools` form,
  so another process may render it in another order;
- ``tools_changed`` / ``system_changed``: the tool list or system prompt differs from the
  previous turn (the whole prompt is recomputed);
- ``history_rewritten``, ``tool_arguments_reserialized``, ``reasoning_dropped``: a
  message of the previous turn is not replayed byte-identically;
- ``prefix_divergence``: where the two turns first differ, in characters (message index
  and offset into its content) and, with a tokenizer, in tokens;
- ``template_divergence`` (with a tokenizer): the messages extend the previous turn, but
  the chat template renders the earlier turn differently (dropped reasoning, a changed
  generation prompt), so its tokens are not a prefix of the new prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentkv.prefix._stable import canonical_json, stable_tools, tool_name
from agentkv.prefix._volatile import volatile_spans

__all__ = ["LintFinding", "Severity", "lint_prompt"]

Severity = Literal["error", "warning", "info"]
_SYSTEM_ROLES = ("system", "developer")
_MAX_FINDINGS_PER_KIND = 20
# Losing a handful of trailing history tokens (a template trimming the last newline) is
# not worth an error; losing more than this many tokens is.
_TEMPLATE_SLACK_TOKENS = 16


@dataclass(frozen=True)
class LintFinding:
    """One problem found by :func:`lint_prompt`.

    Attributes:
        kind: what was found (see the module docstring for the kinds).
        severity: ``"error"``, ``"warning"`` or ``"info"``.
        message: what is wrong, in one sentence.
        fix: what to change.
        location: where, as a path (``messages[0].content``, ``tools[2].function``).
        message_index: index in ``messages``, or ``None`` for tools.
        char_offset: character offset into the located text, when it applies.
        token_offset: index of the first differing prompt token (with a tokenizer).
        prefix_breaking: True when this breaks reuse of the previous turn's prefix.
    """

    kind: str
    severity: Severity
    message: str
    fix: str
    location: str
    message_index: int | None = None
    char_offset: int | None = None
    token_offset: int | None = None
    prefix_breaking: bool = False


# --- volatile content -----------------------------------------------------------------

def _volatile_findings(text: str, location: str, message_index: int | None) -> list[LintFinding]:
    findings = []
    for offset, label, value in volatile_spans(text)[:_MAX_FINDINGS_PER_KIND]:
        shown = value if len(value) <= 40 else value[:37] + "..."
        findings.append(
            LintFinding(
                kind="volatile_content",
                severity="warning",
                message=f"{label} {shown!r} in the stable prefix changes between runs",
                fix=(
                    "move run-specific values out of the system prompt and tool "
                    "descriptions, into the latest user message (or drop them)"
                ),
                location=location,
                message_index=message_index,
                char_offset=offset,
            )
        )
    return findings


# --- helpers ------------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def _common_prefix_chars(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _request_parts(request: Any) -> tuple[list[Mapping[str, Any]], list[Any] | None]:
    """Accept a request body (``messages``/``tools``) or a bare message list."""
    if isinstance(request, Mapping):
        return list(request.get("messages") or []), request.get("tools")
    return list(request or []), None


def _raw_json(value: Any) -> str:
    """JSON text in insertion order, as a chat template would see the dicts."""
    return json.dumps(value, ensure_ascii=False, default=repr)


def _tool_label(index: int, tool: Any) -> str:
    name = tool_name(tool)
    return f"tools[{index}]" + (f" ({name})" if name else "")


# --- single-request checks ------------------------------------------------------------------


def _check_request(messages: list[Mapping[str, Any]], tools: list[Any] | None) -> list[LintFinding]:
    findings: list[LintFinding] = []
    for index, message in enumerate(messages):
        if message.get("role") in _SYSTEM_ROLES:
            text = _content_text(message.get("content"))
            findings += _volatile_findings(text, f"messages[{index}].content", index)
    if not tools:
        return findings
    for index, tool in enumerate(tools):
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("description"), str):
            location = f"{_tool_label(index, tool)}.function.description"
            findings += _volatile_findings(function["description"], location, None)
        if isinstance(function, Mapping) and isinstance(function.get("parameters"), Mapping):
            schema_text = _raw_json(function["parameters"])
            location = f"{_tool_label(index, tool)}.function.parameters"
            findings += _volatile_findings(schema_text, location, None)
    try:
        canonical = stable_tools(tools)
    except Exception as exc:  # report, never raise: lint reads arbitrary input
        findings.append(
            LintFinding(
                kind="tools_invalid",
                severity="error",
                message=f"the tool list cannot be made stable: {exc}",
                fix="fix the tool definition named in the message",
                location="tools",
            )
        )
        return findings
    if _raw_json(list(tools)) != _raw_json(canonical):
        findings.append(
            LintFinding(
                kind="tools_not_canonical",
                severity="warning",
                message=(
                    "the tool list is not in canonical order (tool order or key order), "
                    "so another process can render different bytes"
                ),
                fix="send tools=agentkv.stable_tools(tools)",
                location="tools",
            )
        )
    return findings


# --- pair checks --------------------------------------------------------------------------


def _compare_tools(prev_tools: list[Any] | None, tools: list[Any] | None) -> LintFinding | None:
    before, after = prev_tools or [], tools or []
    if _raw_json(before) == _raw_json(after):
        return None
    try:
        same_logical = canonical_json(stable_tools(before)) == canonical_json(stable_tools(after))
    except Exception:
        same_logical = False
    if same_logical:
        what = "the same tools were sent in a different order or key order"
    else:
        names_before = [tool_name(t) for t in before]
        names_after = [tool_name(t) for t in after]
        if names_before != names_after:
            what = f"the tool list changed ({len(before)} -> {len(after)} tools, names differ)"
        else:
            what = "a tool's description or schema changed"
    return LintFinding(
        kind="tools_changed",
        severity="error",
        message=f"{what} since the previous turn: the whole prompt is recomputed",
        fix=(
            "build the tool list once per conversation with agentkv.stable_tools() and send "
            "the same list on every turn"
        ),
        location="tools",
        prefix_breaking=True,
    )


def _compare_message(
    index: int, before: Mapping[str, Any], after: Mapping[str, Any]
) -> LintFinding | None:
    """Explain how ``after`` differs from ``before`` (None when byte-identical)."""
    if _raw_json(before) == _raw_json(after):
        return None
    location = f"messages[{index}]"
    role = before.get("role")
    if before.get("role") != after.get("role"):
        return _rewrite(index, f"{location}.role", 0, "the message's role changed")
    text_before = _content_text(before.get("content"))
    text_after = _content_text(after.get("content"))
    if text_before != text_after:
        offset = _common_prefix_chars(text_before, text_after)
        if role in _SYSTEM_ROLES:
            return LintFinding(
                kind="system_changed",
                severity="error",
                message=f"the system prompt changed at character {offset}",
                fix="keep the system prompt identical for the whole conversation",
                location=f"{location}.content",
                message_index=index,
                char_offset=offset,
                prefix_breaking=True,
            )
        return _rewrite(index, f"{location}.content", offset, f"{role} content changed")
    for key in ("reasoning", "reasoning_content"):
        if before.get(key) is not None and after.get(key) is None:
            return LintFinding(
                kind="reasoning_dropped",
                severity="error",
                message=f"the assistant message's {key} was dropped on replay",
                fix=f"send the assistant message back with its {key} unchanged",
                location=f"{location}.{key}",
                message_index=index,
                prefix_breaking=True,
            )
    calls_before = list(before.get("tool_calls") or [])
    calls_after = list(after.get("tool_calls") or [])
    if len(calls_before) != len(calls_after):
        return _rewrite(index, f"{location}.tool_calls", None, "tool calls were added or removed")
    for call_index, (call_b, call_a) in enumerate(zip(calls_before, calls_after, strict=True)):
        where = f"{location}.tool_calls[{call_index}]"
        fn_b, fn_a = call_b.get("function") or {}, call_a.get("function") or {}
        args_b, args_a = fn_b.get("arguments"), fn_a.get("arguments")
        if args_b != args_a and isinstance(args_b, str) and isinstance(args_a, str):
            return _arguments_finding(index, f"{where}.function.arguments", args_b, args_a)
        if _raw_json(call_b) != _raw_json(call_a):
            return _rewrite(index, where, None, "a tool call (id, name or arguments) changed")
    return _rewrite(index, location, None, "a message field changed (key order or metadata)")


def _arguments_finding(index: int, location: str, before: str, after: str) -> LintFinding:
    offset = _common_prefix_chars(before, after)
    try:
        parsed_b, parsed_a = json.loads(before), json.loads(after)
        same_order = _raw_json(parsed_b) == _raw_json(parsed_a)
    except (json.JSONDecodeError, TypeError):
        parsed_b, parsed_a, same_order = None, None, False
    if parsed_b is not None and parsed_b == parsed_a:
        detail = (
            "re-serialized with different whitespace"
            if same_order
            else "re-serialized with a different key order"
        )
        message = (
            f"tool-call arguments were {detail}; vLLM parses arguments and re-renders them, "
            "hosted APIs compare the bytes"
        )
        severity: Severity = "warning" if same_order else "error"
    else:
        message, severity = "tool-call arguments changed on replay", "error"
    return LintFinding(
        kind="tool_arguments_reserialized",
        severity=severity,
        message=message,
        fix="replay tool_calls[].function.arguments as the exact string the model produced",
        location=location,
        message_index=index,
        char_offset=offset,
        prefix_breaking=True,
    )


def _rewrite(index: int, location: str, offset: int | None, what: str) -> LintFinding:
    return LintFinding(
        kind="history_rewritten",
        severity="error",
        message=f"history rewritten: {what} since the previous turn",
        fix="append to the conversation; never edit, reorder or re-serialize earlier messages",
        location=location,
        message_index=index,
        char_offset=offset,
        prefix_breaking=True,
    )


def _render_failed(exc: Exception) -> LintFinding:
    return LintFinding(
        kind="render_failed",
        severity="warning",
        message=f"rendering with the tokenizer's chat template failed: {exc}",
        fix="check the tokenizer's chat template and the messages",
        location="messages",
    )


def lint_prompt(
    messages: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    tools: Sequence[Any] | None = None,
    previous: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    tokenizer: Any = None,
) -> list[LintFinding]:
    """Find prefix-cache problems in a chat request (and against the previous one).

    ``messages`` is an OpenAI chat message list, or a whole request body with
    ``messages`` and ``tools``. ``previous`` is the previous request of the same
    conversation (a body, or a message list whose tools are then taken as unchanged);
    with it the pair is checked for tool and system changes, history rewrites and the first divergence point. With a transformers
    ``tokenizer`` (one with a chat template) the divergence is also given in tokens.
    Findings are returned in order; ``prefix_breaking`` marks those that stop the
    previous turn's prefix from being reused. Lint never raises on odd input; it reports.
    """
    body_messages, body_tools = _request_parts(messages)
    current_tools = list(tools) if tools is not None else body_tools
    findings = _check_request(body_messages, current_tools)
    if previous is None:
        return findings
    prev_messages, prev_tools = _request_parts(previous)
    pair: list[LintFinding] = []
    # A bare message list says nothing about its tools: compare tools only when known.
    tools_finding = (
        _compare_tools(prev_tools, current_tools) if isinstance(previous, Mapping) else None
    )
    if tools_finding is not None:
        pair.append(tools_finding)
    first: LintFinding | None = None
    for index in range(min(len(prev_messages), len(body_messages))):
        finding = _compare_message(index, prev_messages[index], body_messages[index])
        if finding is not None:
            first = first or finding
            if len(pair) < _MAX_FINDINGS_PER_KIND:
                pair.append(finding)
    if len(body_messages) < len(prev_messages) and first is None:
        pair.append(
            LintFinding(
                kind="history_truncated",
                severity="info",
                message=(
                    f"the conversation is shorter than the previous turn "
                    f"({len(body_messages)} < {len(prev_messages)} messages); its prefix is "
                    "still cached"
                ),
                fix="nothing to fix if the rewind is intended",
                location="messages",
            )
        )
    if tools_finding is not None or first is not None:
        pair.append(_divergence(first, tools_finding, previous, messages, tokenizer, current_tools))
    elif tokenizer is not None:
        template_finding = _template_divergence(previous, body_messages, current_tools, tokenizer)
        if template_finding is not None:
            pair.append(template_finding)
    return findings + pair


def _template_divergence(
    previous: Any, messages: list[Mapping[str, Any]], tools: list[Any] | None, tokenizer: Any
) -> LintFinding | None:
    """The messages extend the previous turn; check the template renders them so too."""
    from agentkv.prefix._render import render_divergence

    prev_messages, prev_tools = _request_parts(previous)
    if not isinstance(previous, Mapping):
        prev_tools = tools
    try:
        # Without the generation prompt: a template whose assistant header differs from
        # its rendering of a replayed assistant message costs a few tokens, not history.
        offset, num_before = render_divergence(
            tokenizer,
            (prev_messages, prev_tools),
            (messages, tools),
            before_generation_prompt=False,
        )
    except Exception as exc:  # report, never raise
        return _render_failed(exc)
    if offset is None:
        return None
    lost = num_before - offset
    breaking = lost > _TEMPLATE_SLACK_TOKENS
    return LintFinding(
        kind="template_divergence",
        severity="error" if breaking else "info",
        message=(
            "the chat template renders the previous turn differently once the conversation "
            f"continues: tokens differ from token {offset}, so {lost} of the previous "
            f"turn's {num_before} history tokens cannot be reused"
        ),
        fix=(
            "the template rewrites history (e.g. drops earlier reasoning); pick a template "
            "option that keeps it, or accept the loss"
        ),
        location="messages",
        token_offset=offset,
        prefix_breaking=breaking,
    )


def _divergence(
    first: LintFinding | None,
    tools_finding: LintFinding | None,
    previous: Any,
    current: Any,
    tokenizer: Any,
    current_tools: list[Any] | None,
) -> LintFinding:
    token_offset: int | None = None
    tokens = ""
    if tokenizer is not None:
        from agentkv.prefix._render import render_divergence

        prev_messages, prev_tools = _request_parts(previous)
        cur_messages, _ = _request_parts(current)
        if not isinstance(previous, Mapping):
            prev_tools = current_tools
        try:
            token_offset, _ = render_divergence(
                tokenizer, (prev_messages, prev_tools), (cur_messages, current_tools)
            )
        except Exception as exc:  # a template error must not hide the char-level result
            tokens = f" (no token offset: rendering failed: {exc})"
        else:
            tokens = f", token {token_offset}" if token_offset is not None else ""
    if tools_finding is not None:
        where, location, index, offset = "the tool list", "tools", None, None
    else:
        assert first is not None
        where, location = first.location, first.location
        index, offset = first.message_index, first.char_offset
    chars = f", character {offset}" if offset is not None else ""
    return LintFinding(
        kind="prefix_divergence",
        severity="error",
        message=f"first divergence from the previous turn: {where}{chars}{tokens}",
        fix="only the part before this point can be served from the prefix cache",
        location=location,
        message_index=index,
        char_offset=offset,
        token_offset=token_offset,
        prefix_breaking=True,
    )
