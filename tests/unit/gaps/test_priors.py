"""Per-tool-family gap priors: the family of a tool name, and the model answering from them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentkv.gaps._model import GapModel
from agentkv.gaps._priors import ClassPriors, default_priors, family_of
from agentkv.gaps._sketch import GapPrior


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("execute_bash", "shell"),
        ("bash", "shell"),
        ("RunShellCommand", "shell"),
        ("shell:pytest", "shell"),
        ("str_replace_editor", "edit"),
        ("write_file", "edit"),
        ("read_file", "read"),
        ("grep", "search"),
        ("web.fetch", "web"),
        ("think", "think"),
        ("task_tracker", "think"),
        ("final_answer", "finish"),
        ("frobnicate", None),
    ],
)
def test_a_tool_name_maps_to_its_family_by_generic_words(name: str, family: str | None) -> None:
    assert family_of(name) == family


@given(st.text(max_size=60))
def test_family_of_never_raises(name: str) -> None:
    family_of(name)


def test_the_shipped_priors_say_where_they_come_from_and_are_ordered() -> None:
    priors = default_priors()
    prov = priors.provenance
    assert prov["derived_from"] != prov["checked_on"]
    assert "check" in prov and "derived_by" in prov
    assert {"shell", "edit"} <= set(priors.by_family)
    for prior in priors.by_family.values():
        assert 0 < prior.p50_s <= prior.p90_s <= prior.p99_s


PRIORS = ClassPriors({"shell": GapPrior(1.0, 2.0, 20.0), "edit": GapPrior(0.05, 0.1, 1.0)})


def test_an_unlearned_class_of_a_known_family_gets_its_family_prior() -> None:
    m = GapModel(half_life_s=None, min_samples=3, priors=PRIORS)
    est = m.estimate("execute_bash")
    assert (est.p50, est.source, est.n, est.confident) == (1.0, "prior:shell", 0, False)
    assert m.estimate("frobnicate").source == "prior"  # no family: the global prior
    assert m.estimate("execute_bash", kind="tool").source == "prior"  # idle gaps only
    assert m.quantile("str_replace_editor", 0.9) == pytest.approx(0.1)


def test_the_family_prior_answers_before_the_all_tools_pool_and_after_own_samples() -> None:
    m = GapModel(half_life_s=None, min_samples=3, priors=PRIORS)
    for _ in range(5):
        m.observe("other_tool", 9.0, at=0.0)  # the all-tools pool now has 5 samples
    assert m.estimate("execute_bash").source == "prior:shell"
    assert m.estimate("frobnicate").source == "*"
    for gap in (3.0, 3.0, 3.0):
        m.observe("execute_bash", gap, at=0.0)
    assert m.estimate("execute_bash").source == "execute_bash"
