"""Local models for running agentkv without downloads.

:func:`build_tiny_model` writes a tiny random-weight Llama with a locally trained BPE
tokenizer and a chat template that renders tools; :func:`ensure_tiny_model` keeps one
cached build under ``AGENTKV_HOME/models``. Heavy imports (numpy, tokenizers,
safetensors) happen only when a model is built.
"""

from __future__ import annotations

from agentkv.models._cache import hash_model_dir
from agentkv.models._tiny import (
    CHAT_TEMPLATE,
    TinyModelSpec,
    build_tiny_model,
    default_tiny_model_path,
    ensure_tiny_model,
)

__all__ = [
    "CHAT_TEMPLATE",
    "TinyModelSpec",
    "build_tiny_model",
    "default_tiny_model_path",
    "ensure_tiny_model",
    "hash_model_dir",
]
