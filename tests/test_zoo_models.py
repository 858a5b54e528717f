"""Real models from transformers and timm (the zoo extra), tiny, planned at default settings:
each trains exactly like eager at the frugal end and at budget 1.0."""
import pytest
import torch

import planner
from tests.training import assert_same_step

from bench.zoo_models import MODELS, build

# The solvers' time limit, seconds: the plans only need to train like eager (whatever the solver
# proved by then), and at budget 0 each graph's least-peak search and solve use it all where
# they prove nothing (at 5 s, CP-SAT took 5.2 s of a 13 s test on tiny Llama, 2-core CPU).
TIME_LIMIT = 1


def _unimportable(library: str) -> str | None:
    """Why ``library`` cannot be used here, or None. Any error counts, not only ImportError:
    timm imports torchvision, whose registry builds need CUDA torch and fail on the CPU one with
    a RuntimeError."""
    try:
        __import__(library)
    except Exception as err:  # noqa: BLE001  (the reason is reported, not swallowed)
        return f"{library} cannot be imported with torch {torch.__version__}: {type(err).__name__}: {err}"
    return None


@pytest.mark.parametrize("budget", [0.0, 1.0])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_trains_like_eager(name, budget):
    reason = _unimportable(MODELS[name].library)
    if reason:
        pytest.skip(reason)
    graphs = []

    def run(model, inputs):
        compiled = planner.compile(model, memory_budget=budget, codegen="eager", time_limit=TIME_LIMIT)
        graphs.append(compiled.planner_backend)
        return compiled

    assert_same_step(lambda: build(name, "tiny"), run)
    (backend,) = graphs
    assert backend.graphs and all(g.estimator == "auto (flops)" for g in backend.graphs)
    if budget == 0.0:  # each graph at its most frugal peak
        from solvers.frugal import min_peak_plan

        for g in backend.graphs:
            assert g.decision.peak_bytes <= g.decision.budget_bytes == min_peak_plan(g.problem, TIME_LIMIT).plan.peak_bytes


def test_any_transformers_model_type_is_built_as_a_causal_lm_of_the_sizes_asked():
    reason = _unimportable("transformers")
    if reason:
        pytest.skip(reason)
    from bench.zoo_models import _ANY_DECODER, spec

    layers, d, heads, kv, ffn, seq, batch, vocab = _ANY_DECODER["tiny"]
    model, (ids, labels) = build("hf:stablelm", "tiny")  # a type no zoo entry builds
    cfg = model.model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == ("stablelm", layers, d, heads)
    assert (cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == (kv, ffn, vocab)
    assert ids.shape == labels.shape == (batch, seq)
    assert torch.isfinite(model(ids, labels))
    assert spec("hf:stablelm").library == "transformers" and spec("timm:resnet18").library == "timm"


@pytest.mark.parametrize("name, says", [("nope", "timm:ARCH"), ("hf:no_such_type", "no model type 'no_such_type'")])
def test_an_unknown_zoo_model_is_refused_with_the_names_accepted(name, says):
    if name.startswith("hf:") and _unimportable("transformers"):
        pytest.skip(_unimportable("transformers"))
    with pytest.raises(ValueError, match=says):
        build(name, "tiny")
