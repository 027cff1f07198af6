"""Sinks and the two invariants they touch: hints never break the call, no content leaks."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import agentkv
from agentkv import _guard
from agentkv.testing import capture_events

MARKER = "SECRET-MARKER-7f3a9c"


def test_memory_sink_collects_and_bounds() -> None:
    sink = agentkv.MemorySink(max_events=2)
    agentkv.configure(sinks=[sink])
    with agentkv.trajectory("t"), agentkv.tool_call("a"):
        pass
    assert [e.event for e in sink.events] == ["tool_finished", "trajectory_finished"]
    with pytest.raises(ValueError):
        agentkv.MemorySink(max_events=0)


def test_jsonl_sink_writes_one_camel_case_event_per_line(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"
    sink = agentkv.JsonlSink(path)
    agentkv.configure(sinks=[sink])
    with agentkv.trajectory("t-json"), agentkv.tool_call("shell"):
        pass
    assert sink.flush()
    sink.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in rows] == ["tool_started", "tool_finished", "trajectory_finished"]
    assert rows[0]["trajectoryId"] == "t-json" and rows[0]["toolClass"] == "shell"
    parsed = agentkv.TrajectoryEvent.model_validate(rows[1])
    assert parsed.status == "ok"


def test_jsonl_sink_full_buffer_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    # A long interval keeps the writer asleep, so the bounded buffer fills up.
    sink = agentkv.JsonlSink(tmp_path / "e.jsonl", max_queue=10, interval_s=30)
    agentkv.configure(sinks=[sink])
    with agentkv.trajectory("t"):
        for _ in range(50):
            with agentkv.tool_call("x"):
                pass
    assert sink.dropped == 101 - 10
    sink.close()
    assert sink.written == 10
    assert len((tmp_path / "e.jsonl").read_text().splitlines()) == 10


def test_unwritable_jsonl_path_never_breaks_the_tool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sink = agentkv.JsonlSink(blocker / "events.jsonl")
    agentkv.configure(sinks=[sink])

    @agentkv.tool
    def work(x: int) -> int:
        return x * 2

    with caplog.at_level(logging.WARNING, logger="agentkv"), agentkv.trajectory("t"):
        assert work(21) == 42
    sink.close()
    assert sink.write_errors >= 1 and sink.written == 0
    assert "cannot write events" in caplog.text


def test_raising_sink_is_contained_when_not_strict(caplog: pytest.LogCaptureFixture) -> None:
    def boom(event: agentkv.TrajectoryEvent) -> None:
        raise RuntimeError("sink exploded")

    agentkv.configure(sinks=[agentkv.CallbackSink(boom)], strict=False)

    @agentkv.tool
    def work() -> str:
        return "done"

    with caplog.at_level(logging.WARNING, logger="agentkv"), agentkv.trajectory("t"):
        assert work() == "done"
        assert work() == "done"
    assert _guard.error_counts()["sink CallbackSink"] == 5
    assert caplog.text.count("sink exploded") == 1  # logged once, counted always


def test_raising_sink_propagates_in_strict_mode() -> None:
    def boom(event: agentkv.TrajectoryEvent) -> None:
        raise RuntimeError("sink exploded")

    agentkv.configure(sinks=[agentkv.CallbackSink(boom)], strict=True)
    with pytest.raises(RuntimeError, match="sink exploded"), agentkv.trajectory("t"):
        pass


def test_configure_rejects_non_sinks() -> None:
    with pytest.raises(agentkv.ConfigError, match="CallbackSink"):
        agentkv.configure(sinks=[object()])


def test_no_tool_argument_or_output_reaches_any_sink(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    memory = agentkv.MemorySink()
    jsonl = agentkv.JsonlSink(tmp_path / "e.jsonl")
    seen: list[str] = []
    agentkv.configure(
        sinks=[
            memory,
            jsonl,
            agentkv.CallbackSink(lambda e: seen.append(e.model_dump_json())),
            agentkv.OTelSink(tracer_provider=provider),
        ]
    )

    @agentkv.tool(tool_class="shell")
    def run(cmd: str) -> str:
        return f"output {MARKER} {cmd}"

    @agentkv.tool
    def fail(cmd: str) -> None:
        raise ValueError(MARKER)

    with capture_events() as captured, agentkv.trajectory("t", metadata={"note": "x"}):
        with agentkv.model_call():
            pass
        run(f"echo {MARKER}")
        with pytest.raises(ValueError):
            fail(MARKER)
    jsonl.close()
    texts = [e.model_dump_json() for e in captured + memory.events]
    texts += [*seen, (tmp_path / "e.jsonl").read_text()]
    texts += [json.dumps(dict(s.attributes or {})) + s.name for s in exporter.get_finished_spans()]
    assert len(texts) > 5
    assert not [t for t in texts if MARKER in t]


def test_agentkv_flush_puts_buffered_events_on_disk(tmp_path: Path) -> None:
    sink = agentkv.JsonlSink(tmp_path / "e.jsonl", interval_s=30)  # writer would sleep 30 s
    agentkv.configure(sinks=[sink])
    with agentkv.trajectory("t"):
        pass
    assert agentkv.flush(5) is True
    assert json.loads((tmp_path / "e.jsonl").read_text())["event"] == "trajectory_finished"
    sink.close()


# -- issue 13, finding 12: JsonlSink framing, counters and size --------------------------
def _events(n: int) -> list[agentkv.TrajectoryEvent]:
    return [
        agentkv.TrajectoryEvent(
            trajectory_id=f"t{i}", turn_id=i, event="tool_started", emitted_at_ms=i
        )
        for i in range(n)
    ]


def test_finding12_jsonl_starts_a_fresh_line_after_a_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"event": "tool_sta')  # a writer died mid-line
    sink = agentkv.JsonlSink(path)
    for ev in _events(2):
        sink.emit(ev)
    sink.close()
    fragment, *rows = path.read_text().splitlines()
    assert fragment == '{"event": "tool_sta'
    assert [json.loads(r)["trajectoryId"] for r in rows] == ["t0", "t1"]
    assert sink.written == 2


WRITE_LIMITED = """
import json, resource, signal, sys
import agentkv
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
sink = agentkv.JsonlSink(sys.argv[1], interval_s=30)
for i in range(50):
    sink.emit(agentkv.TrajectoryEvent(trajectory_id=f"t{i}", turn_id=i, event="tool_started",
                                      emitted_at_ms=i))
sink.close()
print(json.dumps({"written": sink.written, "dropped": sink.dropped}))
"""


def test_finding12_jsonl_counts_the_lines_that_landed(tmp_path: Path) -> None:
    """A write cut short (file-size limit) counts the whole lines on disk as written."""
    import subprocess
    import sys

    path = tmp_path / "e.jsonl"
    out = subprocess.run(
        [sys.executable, "-c", WRITE_LIMITED, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    text = path.read_text()
    whole = [line for line in text.split("\n")[:-1] if line]
    assert 0 < len(whole) < 50 and len(text) <= 1000
    assert counts["written"] == len(whole)
    assert counts["written"] + counts["dropped"] == 50


def test_finding12_jsonl_rotates_at_max_bytes_and_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    sink = agentkv.JsonlSink(path, max_bytes=400, backups=2)
    for ev in _events(30):
        sink.emit(ev)
        assert sink.flush()
    sink.close()
    files = [path, path.with_name("e.jsonl.1"), path.with_name("e.jsonl.2")]
    assert all(f.exists() for f in files) and not path.with_name("e.jsonl.3").exists()
    assert all(f.stat().st_size <= 400 for f in files)
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert sink.rotations >= 2 and sink.written == 30
    rows = [json.loads(line) for f in reversed(files) for line in f.read_text().splitlines()]
    assert [int(r["turnId"]) for r in rows] == list(range(30 - len(rows), 30))  # newest kept


def test_max_bytes_holds_for_a_batch_larger_than_the_bound(tmp_path: Path) -> None:
    """A burst buffered into one batch (here 200 events, ~40 KB) is split where it would
    cross max_bytes: no file grows past the bound, and the newest events are kept."""
    path = tmp_path / "burst.jsonl"
    sink = agentkv.JsonlSink(path, max_bytes=4096, backups=3, interval_s=60.0)
    for ev in _events(200):
        sink.emit(ev)  # the writer sleeps: all 200 go out as one batch at close
    sink.close()
    files = [path] + [path.with_name(f"burst.jsonl.{i}") for i in (1, 2, 3)]
    assert all(f.exists() for f in files)
    assert max(f.stat().st_size for f in files) <= 4096
    assert sink.written == 200 and sink.rotations >= 3
    newest = [json.loads(line) for line in path.read_text().splitlines()]
    assert int(newest[-1]["turnId"]) == 199
