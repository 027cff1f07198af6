"""``agentkv serve`` end to end: clean AGENTKV_HOME -> builds the tiny model, serves, answers, stops;
a vLLM flag agentkv does not know (``--max-num-seqs 8``) goes through."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.server, pytest.mark.slow]


def _cmdlines() -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            out.append((entry / "cmdline").read_text())
    return out


def test_agentkv_serve_from_a_clean_home(tmp_path: Path, agentkv_server_factory: Any) -> None:
    from openai import OpenAI

    from agentkv.vllm import find_free_port

    agentkv_server_factory.stop_all()  # two cores: never run two servers at once
    home = tmp_path / "home"
    port = find_free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentkv", "serve", "--max-num-seqs", "8", "--port", str(port),
         "--enforce-eager", "--block-size", "32", "--num-gpu-blocks-override", "64",
         "--kv-cache-memory-gib", "1"],
        env={**os.environ, "AGENTKV_HOME": str(home)}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + float(os.environ.get("AGENTKV_TEST_SERVE_TIMEOUT_S", 900))
        # Ready when agentkv serve says so (its banner comes after vLLM's /health answers
        # and after it installs its signal handlers; Ctrl-C before that is an interrupted
        # start, exit status 130).
        while "agentkv serve: OpenAI API at" not in (tmp_path / "serve.log").read_text():
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "agentkv serve did not become ready"
            time.sleep(1)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        assert any((home / "models").glob("tiny-llama-*/model.safetensors"))
        # vLLM's own flag went through unchanged (`agentkv serve --max-num-seqs 8`)
        assert any(
            "--max-num-seqs\x008\x00" in cmd and f"--port\x00{port}\x00" in cmd
            for cmd in _cmdlines()
        )
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=300)
        reply = client.chat.completions.create(
            model="agentkv-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        client.close()
        assert reply.choices[0].message is not None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()
