"""The tiny local model: deterministic files, consistent vocabulary, a chat template with tools."""

from __future__ import annotations

import json
from pathlib import Path

from agentkv.models import (
    build_tiny_model,
    default_tiny_model_path,
    ensure_tiny_model,
    hash_model_dir,
)


def test_two_builds_are_byte_identical(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a")
    b = build_tiny_model(tmp_path / "b")
    assert hash_model_dir(a) == hash_model_dir(b)
    assert {p.name for p in a.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_tokenizer_covers_exactly_the_model_vocabulary(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = build_tiny_model(tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tok.get_vocab_size() == config["vocab_size"]
    assert config["hidden_size"] // config["num_attention_heads"] == 32
    assert config["max_position_embeddings"] >= 32768
    text = "The tool returned: 42 passed."
    assert tok.decode(tok.encode(text).ids) == text


def test_chat_template_renders_tools_and_tool_calls(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(build_tiny_model(tmp_path / "m")))
    tools = [
        {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}
    ]
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]  # fmt: skip
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert '"name": "run_shell"' in text and "You are helpful." in text
    assert '<tool_call>{"name": "run_shell", "arguments": {"command": "ls"}}</tool_call>' in text
    assert "<tool_response>\na.txt\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_default_model_is_built_once_under_agentkv_home() -> None:
    first = ensure_tiny_model()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model() == first == default_tiny_model_path()
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
