"""Build a tiny random-weight Llama that vLLM can serve anywhere.

The model exists so the whole loop (harness -> hints -> vLLM scheduler -> cache reuse)
runs on a laptop without downloading anything. Its outputs are noise; its prefill and
KV-cache behaviour are real. Every file is a pure function of the build options: the
weights come from a seeded generator, the BPE tokenizer is trained on a corpus shipped
inside this package, and JSON is written with sorted keys, so two builds are byte-equal.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentkv._errors import ConfigError, ServeError
from agentkv._paths import agentkv_home
from agentkv.models._cache import build_once

__all__ = [
    "CHAT_TEMPLATE",
    "TinyModelSpec",
    "build_tiny_model",
    "default_tiny_model_path",
    "ensure_tiny_model",
]

#: Bumped whenever the files produced for the same spec change.
BUILD_FORMAT = 2

SPECIAL_TOKENS = [
    "<|pad|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

#: ChatML-style template; renders a tool list, assistant tool calls and tool results.
#: It is one line of Jinja, so it needs no whitespace control.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] if messages[0]['content'] is string else '' }}\n\n"
    "{% endif %}"
    "# Tools\nYou may call these functions. Answer a call as <tool_call>JSON</tool_call>.\n"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "<|im_end|>\n"
    "{% elif messages and messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n"
    "{{ messages[0]['content'] if messages[0]['content'] is string else '' }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% if not loop.first %}"
    "<|im_start|>system\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>tool\n<tool_response>\n"
    "{{ message['content'] if message['content'] is string else message['content'] | tojson }}"
    "\n</tool_response><|im_end|>\n"
    "{% elif message['role'] == 'assistant' %}"
    "<|im_start|>assistant\n"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% if message.get('tool_calls') %}"
    "{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call.get('function') else call %}"
    '\n<tool_call>{"name": {{ fn["name"] | tojson }}, "arguments": '
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}"
    "{% else %}{{ fn['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] if message['content'] is string else '' }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TinyModelSpec(BaseModel):
    """Shape of the tiny Llama. Defaults give head dim 32, which vLLM's CPU attention supports."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 0
    num_layers: int = Field(default=4, ge=1, le=32)
    hidden_size: int = Field(default=128, ge=32)
    num_heads: int = Field(default=4, ge=1)
    num_kv_heads: int = Field(default=4, ge=1)
    intermediate_size: int = Field(default=256, ge=8)
    vocab_size: int = Field(default=2048, ge=1024, le=65536)
    max_position_embeddings: int = Field(default=32768, ge=512)

    def key(self) -> str:
        """Short stable digest of the spec and build format (used in the cache path)."""
        blob = json.dumps({"format": BUILD_FORMAT, **self.model_dump()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _corpus_lines() -> list[str]:
    text = resources.files("agentkv.models").joinpath("_corpus.txt").read_text("utf-8")
    return [line for line in text.splitlines() if line.strip()]


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    # Pad to exactly vocab_size, so every id the model can sample decodes to visible text
    # (ordinary added tokens; their spelling never occurs in real input).
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(f"<r{i}>", special=False) for i in range(missing)])
    return tok


def _weights(spec: TinyModelSpec) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    h, inter, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    head_dim = h // spec.num_heads
    kv = spec.num_kv_heads * head_dim

    def normal(*shape: int) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(v, h)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(h, h)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv, h)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv, h)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, h)
        tensors[p + "mlp.gate_proj.weight"] = normal(inter, h)
        tensors[p + "mlp.up_proj.weight"] = normal(inter, h)
        tensors[p + "mlp.down_proj.weight"] = normal(h, inter)
        tensors[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
    tensors["model.norm.weight"] = np.ones(h, dtype=np.float32)
    tensors["lm_head.weight"] = normal(v, h)
    return tensors


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_tiny_model(path: str | os.PathLike[str], spec: TinyModelSpec | None = None) -> Path:
    """Write a tiny Llama (config, safetensors weights, tokenizer, chat template) to ``path``.

    ``path`` must be empty or absent. The result is deterministic: the same spec gives
    byte-identical files (see :func:`~agentkv.models.hash_model_dir`). Needs ``numpy``,
    ``safetensors`` and ``tokenizers`` (installed with ``pip install 'agentkv-cache[cpu]'``).
    """
    spec = spec or TinyModelSpec()
    if spec.hidden_size % spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise ConfigError(
            "hidden_size must be a multiple of num_heads, and num_heads of num_kv_heads; "
            f"got hidden_size={spec.hidden_size}, num_heads={spec.num_heads}, "
            f"num_kv_heads={spec.num_kv_heads}"
        )
    try:
        from safetensors.numpy import save_file
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ServeError(
            "building the tiny model needs numpy, safetensors and tokenizers: "
            "pip install 'agentkv-cache[cpu]'"
        ) from exc
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty; pass a new directory to build_tiny_model")
    out.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer(spec.vocab_size)
    if tok.get_vocab_size() != spec.vocab_size:
        raise ConfigError(
            f"the tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size="
            f"{spec.vocab_size}; raise vocab_size"
        )
    tok.save(str(out / "tokenizer.json"), pretty=False)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    _write_configs(out, spec, ids["<|begin_of_text|>"], ids["<|im_end|>"], ids["<|pad|>"])
    save_file(_weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _write_configs(out: Path, spec: TinyModelSpec, bos: int, eos: int, pad: int) -> None:
    """The model, generation and tokenizer configs (the chat template rides in the last)."""
    _write_json(
        out / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads,
            "num_key_value_heads": spec.num_kv_heads,
            "head_dim": spec.hidden_size // spec.num_heads,
            "hidden_act": "silu",
            "max_position_embeddings": spec.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "vocab_size": spec.vocab_size,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "torch_dtype": "bfloat16",
            "attention_bias": False,
            "mlp_bias": False,
            "agentkv_tiny_model": {"format": BUILD_FORMAT, "seed": spec.seed},
        },
    )
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad},
    )
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|pad|>",
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": spec.max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"},
    )


def default_tiny_model_path(spec: TinyModelSpec | None = None) -> Path:
    """Where :func:`ensure_tiny_model` keeps the default build: ``AGENTKV_HOME/models/...``."""
    spec = spec or TinyModelSpec()
    return agentkv_home() / "models" / f"tiny-llama-{spec.key()}"


def ensure_tiny_model(spec: TinyModelSpec | None = None) -> Path:
    """Return the cached tiny model directory, building it once if it is missing.

    Safe against concurrent callers: the build happens in a temporary directory under a
    file lock and is moved into place when complete.
    """
    return build_once(default_tiny_model_path(spec), lambda out: build_tiny_model(out, spec))
