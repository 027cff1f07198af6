"""The gap model's per-model-call path: same answers as the general path, flushes keep up."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv import GapModel
from agentkv.gaps._model import ALL_TOOLS
from agentkv.gaps._priors import default_priors
from agentkv.gaps._store import GapStore
from agentkv.gaps._sync import StoreSync
from agentkv.testing import FakeClock

CLASSES = [ALL_TOOLS, "shell", "shell:pytest", "edit", "x:y:z", "x"]
_op = st.one_of(
    st.tuples(
        st.just("observe"),
        st.sampled_from(CLASSES),
        st.floats(0.0, 50.0),
        st.sampled_from(["idle", "tool"]),
        st.floats(0.0, 3 * 86_400.0),
    ),
    st.tuples(st.just("estimate"), st.sampled_from(CLASSES), st.sampled_from(["idle", "tool"])),
    st.tuples(st.just("exact"), st.sampled_from(CLASSES)),
    st.tuples(st.just("reload")),
)


def _model() -> GapModel:
    return GapModel(min_samples=3, priors=default_priors(), clock=FakeClock())


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=120))
def test_estimates_equal_the_chain_walk_for_any_history(ops):
    """The remembered answering level (``answers``) gives what walking the chain gives."""
    fast, walk = _model(), _model()
    t0 = 1_800_000_000.0
    for op in ops:
        if op[0] == "observe":
            _, cls, gap_s, kind, dt = op
            for m in (fast, walk):
                m.observe(cls, gap_s, at=t0 + dt, kind=kind)
        elif op[0] == "estimate":
            walk._table.answers.clear()
            assert fast.estimate(op[1], kind=op[2]) == walk.estimate(op[1], kind=op[2])
        elif op[0] == "exact":
            walk._table.answers.clear()
            a = fast.estimate(op[1], fallback=False)
            assert a == walk.estimate(op[1], fallback=False)
        else:  # levels replaced by records: remembered answers must go
            for m in (fast, walk):
                m.import_records(m.export_records())
    for cls in CLASSES:
        walk._table.answers.clear()
        assert fast.estimate(cls) == walk.estimate(cls)


def test_a_class_answers_itself_once_it_holds_enough_samples():
    m = _model()
    for _ in range(3):
        m.observe("x", 1.0)
    for _ in range(2):
        assert m.estimate("x:y").source == "x"  # its parent, while it is small
        m.observe("x:y", 9.0)
    assert m.estimate("x:y").source == "x"
    m.observe("x:y", 9.0)
    assert (m.estimate("x:y").source, m.estimate("x:y").p50) == ("x:y", 9.0)
    assert m.estimate("x").source == "x"
    m.import_records(m.export_records())
    assert m.estimate("x:y").source == "x:y"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, "shell", "edit:x"]),
            st.floats(0.0, 60_000.0),
            st.sampled_from([0, 5, 1_800_000_000_000, 1_800_000_500_000]),
        ),
        max_size=60,
    )
)
def test_learn_idle_learns_what_observe_learns(samples):
    a, b = _model(), _model()
    for cls, gap_ms, at_ms in samples:
        a.learn_idle(cls, gap_ms, at_ms)
        at = at_ms / 1000.0 if at_ms >= 1_000_000_000_000 else None
        b.observe(cls or ALL_TOOLS, gap_ms / 1000.0, at=at, kind="idle")
    assert a.export_records() == b.export_records()
    for cls in CLASSES:
        assert a.estimate(cls) == b.estimate(cls)


def test_learn_idle_drops_a_bad_gap_like_observe(monkeypatch):
    monkeypatch.setenv("AGENTKV_STRICT", "0")
    m = _model()
    m.learn_idle(None, float("nan"), 0)
    m.learn_idle(None, -1.0, 0)
    assert m.tool_classes() == []


def test_learning_during_a_flush_asks_for_none_and_the_flush_catches_up(tmp_path):
    """A learn-only loop must not fall behind: samples learned while a flush runs do not
    each ask for another one; the running flush goes again once a batch's worth is in,
    and asks for each class's levels once per batch."""
    store = GapStore(tmp_path / "g.sqlite3")
    m = GapModel(flush_every=1_000_000)
    sync = StoreSync(
        store,
        "default",
        flush_every=4,
        flush_interval_s=3600.0,
        decay=m._decay,
        ewma_alpha=0.2,
        max_centroids=50,
        clock=FakeClock(),
    )
    gate, asked = threading.Event(), []
    flushes = []

    def levels_of(kind: str, cls: str) -> tuple[str, ...]:
        asked.append((kind, cls))
        return (cls, ALL_TOOLS) if cls != ALL_TOOLS else (ALL_TOOLS,)

    def flush() -> bool:
        flushes.append(len(sync.pending()))
        ok = sync.push(levels_of)[0]
        gate.wait(10.0)
        return ok

    sync.queue(("idle", "t", 1.0, 1.0))
    sync.flush_in_background(flush)
    due = [sync.queue(("idle", "t" if i % 2 else ALL_TOOLS, 1.0, 1.0)) for i in range(10)]
    assert not any(due)  # a flush runs: nobody asks for another
    gate.set()
    assert sync.wait_idle(10.0)
    assert sync.pending() == []  # it went again for the 10 learned meanwhile
    assert flushes[0] == 1 and sum(flushes) == 11
    assert asked.count(("idle", "t")) == len(flushes) and asked.count(("idle", ALL_TOOLS)) == 1
    assert {r.tool_class: r.n for r in store.read("default")} == {ALL_TOOLS: 11, "t": 6}
    assert sync.queue(("idle", "t", 1.0, 1.0)) is False  # 1 < flush_every
    store.close()
