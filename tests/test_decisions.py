"""One solve per distinct graph: decisions kept in memory and on disk, per graph and settings."""
from __future__ import annotations

import json

import pytest

import planner
from planner.decisions import forget_decisions
from planner.models import GPTConfig, gpt_example

CFG = GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=16, vocab=64, dropout=0.0, batch=2)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()
    yield tmp_path / "decisions"
    forget_decisions()


def plan(budget=0.5, **settings):
    model, batch = gpt_example(CFG)
    return planner.plan(model, batch, memory_budget=budget, solver="greedy", **settings)


def test_the_same_graph_and_settings_are_solved_once(cache):
    first = plan()
    assert "reused" not in first.decision.stats
    again = plan()
    assert again.decision.stats["reused"] == "memory"
    assert again.saved == first.saved
    forget_decisions()  # a new process: the disk cache answers
    assert plan().decision.stats["reused"] == "disk"
    assert len(list(cache.glob("*.json"))) == 1


def test_other_settings_are_solved_again(cache):
    plan(0.5)
    assert "reused" not in plan(0.2).decision.stats
    assert "reused" not in plan(0.5, estimator="constant").decision.stats
    assert len(list(cache.glob("*.json"))) == 3


def test_a_damaged_cache_file_is_solved_again(cache):
    first = plan()
    forget_decisions()
    (path,) = cache.glob("*.json")
    path.write_text('{"saved": ["no_such_node"]')  # cut short
    assert "reused" not in plan().decision.stats
    forget_decisions()
    record = first.decision.to_dict() | {"saved": ["no_such_node"]}
    path.write_text(json.dumps(record))  # names a node this graph lacks
    again = plan()
    assert "reused" not in again.decision.stats and again.saved == first.saved


def test_a_decision_is_written_as_plain_data_or_the_error_names_what_is_not():
    import numpy as np
    from planner.decision import Decision

    decision = Decision(saved=("a",), solver="greedy", budget_bytes=np.int64(10), memory_bytes=4, peak_bytes=8,
                        recompute_seconds=np.float32(0.5), status="heuristic", gap=None, solve_seconds=0.1,
                        stats={"blocks": {"start": np.int64(3), "sizes": (1, 2)}, "proven": np.bool_(True)})
    record = decision.to_dict()
    assert json.loads(json.dumps(record)) == record
    assert record["budget_bytes"] == 10 and type(record["budget_bytes"]) is int
    assert record["stats"] == {"blocks": {"start": 3, "sizes": [1, 2]}, "proven": True}
    assert Decision.from_dict(record).saved == ("a",)
    odd = Decision(**{**vars(decision), "stats": {"fast_end": {"compared": {"split": object()}}}})
    with pytest.raises(TypeError, match=r"stats\.fast_end\.compared\.split holds a builtins\.object"):
        odd.to_dict()


def test_a_decision_the_cache_cannot_keep_is_used_and_said(cache, monkeypatch):
    from planner.decision import Decision

    def unwritable(self):
        raise TypeError("decision field stats.x holds a builtins.object")

    monkeypatch.setattr(Decision, "to_dict", unwritable)
    with pytest.warns(UserWarning, match="not written to the disk cache: decision field stats.x"):
        first = plan()
    assert first.saved and not list(cache.glob("*.json"))
    assert plan().decision.stats["reused"] == "memory"
