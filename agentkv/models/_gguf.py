"""Turn a Llama-architecture GGUF file into the pieces of a Hugging Face checkpoint.

A GGUF holds quantized tensors under llama.cpp's names, the model's hyperparameters and
its tokenizer (vocabulary, merges, special tokens, chat template) as metadata. vLLM's CPU
build serves Hugging Face checkpoints, so this module reads a GGUF with the ``gguf``
package and gives back what such a checkpoint needs:

- :func:`read_llama_gguf`: the metadata and a ``config.json`` for ``LlamaForCausalLM``;
- :func:`iter_hf_tensors`: every tensor dequantized to float32, under its Hugging Face
  name, with the query and key projections put back in Hugging Face's row order
  (:func:`unpermute_qk`);
- :func:`make_byte_level_tokenizer`: a ``tokenizers`` byte-level BPE tokenizer from the
  vocabulary and merges.

Only Llama files with a ``gpt2`` (byte-level BPE) tokenizer are handled; anything else is
a :class:`~agentkv.ConfigError`. numpy and gguf are imported when a file is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError

__all__ = [
    "LlamaGGUF",
    "hf_tensor_name",
    "iter_hf_tensors",
    "make_byte_level_tokenizer",
    "read_llama_gguf",
    "unpermute_qk",
]

#: llama.cpp's per-layer tensor names and their Hugging Face Llama counterparts.
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_GLOBAL_NAME = re.compile(r"^([a-z_]+)\.(weight|bias)$")

#: GGUF token type of control tokens (``<|im_start|>`` and the like).
CONTROL_TOKEN_TYPE = 3


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face Llama name of a GGUF tensor (None for a tensor HF has no place for)."""
    if match := _LAYER_NAME.match(gguf_name):
        layer, part, kind = match.groups()
        hf = _LAYER_TENSORS.get(part)
        return f"model.layers.{layer}.{hf}.{kind}" if hf else None
    if match := _GLOBAL_NAME.match(gguf_name):
        part, kind = match.groups()
        hf = _GLOBAL_TENSORS.get(part)
        return f"{hf}.{kind}" if hf else None
    return None


def unpermute_qk(weight: Any, num_heads: int) -> Any:
    """Undo the row order llama.cpp's Llama export gives a query or key projection.

    Hugging Face's Llama applies rotary embeddings to the two halves of each head (row
    ``i`` pairs with row ``i + head_dim / 2``); llama.cpp rotates adjacent rows
    (``2j`` with ``2j + 1``), so its exporter interleaves each head's halves: its row
    ``2j + h`` is Hugging Face's row ``j + h * head_dim / 2``. This puts the rows back.
    ``num_heads`` is the number of heads the matrix projects to (the key-value heads for
    ``k_proj``). Works on a matrix (rows x inputs) or a bias vector.
    """
    rows = weight.shape[0]
    if num_heads < 1 or rows % (2 * num_heads):
        raise ConfigError(
            f"a projection of {rows} rows cannot be split into {num_heads} rotary heads"
        )
    half = rows // num_heads // 2
    rest = weight.shape[1:]
    return weight.reshape(num_heads, half, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


@dataclass(frozen=True)
class LlamaGGUF:
    """An opened Llama GGUF: its path, the ``gguf`` reader and the metadata values."""

    path: Path
    reader: Any
    metadata: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        """One metadata value by its GGUF key (``llama.block_count``, ...)."""
        return self.metadata.get(key, default)

    def hf_config(self) -> dict[str, Any]:
        """``config.json`` content for ``LlamaForCausalLM`` (dtype and ids added by the caller)."""
        hidden = int(self.metadata["llama.embedding_length"])
        heads = int(self.metadata["llama.attention.head_count"])
        head_dim = int(self.get("llama.rope.dimension_count", hidden // heads))
        names = {t.name for t in self.reader.tensors}
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": int(self.metadata["llama.feed_forward_length"]),
            "num_hidden_layers": int(self.metadata["llama.block_count"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self.get("llama.attention.head_count_kv", heads)),
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": int(self.metadata["llama.context_length"]),
            # GGUF stores float32; write the decimal the exporter was given (1e-05, not
            # 9.999999747378752e-06).
            "rms_norm_eps": float(f"{self.metadata['llama.attention.layer_norm_rms_epsilon']:.6g}"),
            "rope_theta": float(self.get("llama.rope.freq_base", 10000.0)),
            "tie_word_embeddings": "output.weight" not in names,
            "vocab_size": len(self.metadata["tokenizer.ggml.tokens"]),
            "attention_bias": "blk.0.attn_q.bias" in names,
            "mlp_bias": False,
        }


def _field_value(field: Any) -> Any:
    value = field.contents()
    return value.tolist() if hasattr(value, "tolist") else value


def read_llama_gguf(path: str | Path) -> LlamaGGUF:
    """Open a GGUF file and check it is a Llama model with a byte-level BPE tokenizer.

    Raises:
        ConfigError: the ``gguf`` package is missing, or the file is not such a model.
    """
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "reading a GGUF file needs the gguf package: pip install 'agentkv-cache[cpu]'"
        ) from exc
    reader = GGUFReader(str(path))
    metadata = {key: _field_value(field) for key, field in reader.fields.items()}
    arch, tokenizer = metadata.get("general.architecture"), metadata.get("tokenizer.ggml.model")
    if arch != "llama" or tokenizer != "gpt2":
        raise ConfigError(
            f"{path}: only Llama GGUF files with a byte-level BPE tokenizer can be converted "
            f"(this one: architecture {arch!r}, tokenizer {tokenizer!r})"
        )
    return LlamaGGUF(Path(path), reader, metadata)


def iter_hf_tensors(model: LlamaGGUF) -> Iterator[tuple[str, Any]]:
    """``(hf_name, float32 array)`` for every tensor, dequantized and in Hugging Face's layout.

    The query and key projections (and their biases) are un-permuted with
    :func:`unpermute_qk`; tensors Hugging Face's Llama has no place for (llama.cpp's
    precomputed rotary factors) are left out.
    """
    import numpy as np
    from gguf import dequantize

    config = model.hf_config()
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for tensor in model.reader.tensors:
        name = hf_tensor_name(tensor.name)
        if name is None:
            continue
        # A copy: F32 tensors come back as views of the file's memory map.
        array = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        projection = name.split(".")[-2]
        if projection in heads:
            array = np.ascontiguousarray(unpermute_qk(array, heads[projection]))
        yield name, array


def make_byte_level_tokenizer(model: LlamaGGUF) -> Any:
    """A ``tokenizers.Tokenizer`` for the file's byte-level BPE vocabulary.

    Digits are split one by one before the GPT-2 split, as llama.cpp does for the
    ``smollm``, ``starcoder`` and ``refact`` pre-tokenizers; other pre-tokenizer types
    are refused rather than guessed. Control tokens become special added tokens (they
    keep their ids).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    pre = model.get("tokenizer.ggml.pre")
    if pre not in ("smollm", "starcoder", "refact"):
        raise ConfigError(
            f"{model.path}: pre-tokenizer {pre!r} is not supported; supported: smollm, "
            "starcoder, refact"
        )
    tokens: list[str] = model.metadata["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in model.metadata["tokenizer.ggml.merges"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ConfigError(f"{model.path}: the vocabulary spells some tokens twice")
    unk = model.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    types = model.metadata.get("tokenizer.ggml.token_type") or []
    control = [t for t, kind in zip(tokens, types, strict=False) if kind == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    if tok.get_vocab_size() != len(tokens):
        raise ConfigError(f"{model.path}: the tokenizer does not cover the vocabulary exactly")
    return tok
