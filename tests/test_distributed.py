"""DDP and FSDP2 with the planner, two processes on CPU (gloo): the same losses and gradients as
the same engine in eager, one decision for every rank, and clear errors when the ranks differ.

The ranks run ``tests/distributed_worker.py`` under ``torch.distributed.run``; every test here
reads what they wrote. FSDP2 runs on CPU with gloo on the pinned torch, so it is covered here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")
RANKS = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("distributed")
    env = os.environ | {"PYTHONPATH": str(WORKER.parent.parent), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", str(WORKER), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    for rank, result in enumerate(results):
        for name, scenario in result.items():
            assert "crashed" not in scenario, f"rank {rank}, {name}:\n{scenario['crashed']}"
    return results


def assert_trains_like_eager(result: dict) -> None:
    (eager_losses, eager_grads), (losses, grads) = result["eager"], result["planned"]
    np.testing.assert_allclose(losses, eager_losses, atol=1e-5, rtol=0)
    assert grads.keys() == eager_grads.keys()
    for name in eager_grads:
        np.testing.assert_allclose(grads[name], eager_grads[name], atol=1e-5, rtol=0, err_msg=f"gradient {name}")


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_engine_trains_like_eager(ranks, engine):
    for result in ranks:
        assert_trains_like_eager(result[engine])
        assert sum(d["recomputed"] for d in result[engine]["decisions"]) > 0  # the plans do recompute


def test_ddp_graphs_are_planned_against_one_budget(ranks):
    # DDP's graph splitting (one graph per gradient bucket) gives several graphs in one step,
    # and the step's prediction counts each of them
    result = ranks[0]["ddp"]
    assert len(result["decisions"]) >= 2
    assert result["step_graphs"] == len(result["decisions"])
    # each graph runs once before its backward, as it was planned for
    assert result["repeats"] == 1 and result["runs"] == [1] * len(result["decisions"])


def test_fsdp2_blocks_compiled_one_by_one_solve_once_for_both_runs(ranks):
    # two blocks, each compiled on its own (planner.compile_blocks): one graph, one solve,
    # planned for the two runs it makes before its backward, as counted while it trained
    for result in ranks:
        assert len(result["fsdp2"]["decisions"]) == 1
        assert result["fsdp2"]["repeats"] == 2 and result["fsdp2"]["runs"] == [2]


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_every_rank_runs_rank0s_decision(ranks, engine):
    first, second = (r[engine]["decisions"] for r in ranks)
    assert [d["fingerprint"] for d in first] == [d["fingerprint"] for d in second]
    assert [d["saved"] for d in first] == [d["saved"] for d in second]
    assert all("decided_on_rank" not in d["stats"] for d in first)
    assert all(d["stats"]["decided_on_rank"] == 0 for d in second)


def test_collectives_are_never_recomputed(ranks):
    for result in ranks:
        scenario = result["collectives"]
        assert_trains_like_eager(scenario)
        # all_reduce, all_gather and their two waits
        assert len(scenario["collectives"]) == 4
        assert scenario["recomputed"], "budget 0 recomputes something in this graph"
        assert not set(scenario["collectives"]) & set(scenario["recomputed"])


def test_different_graphs_on_the_ranks_are_named(ranks):
    for rank, result in enumerate(ranks):
        error = result["mismatch"]
        assert error["error"] == "RankMismatch"
        assert "rank 0: graph" in error["message"] and "rank 1: graph" in error["message"]
        assert f"rank {rank} raised this" in error["message"]


def test_rank0s_failure_reaches_every_rank(ranks):
    assert ranks[0]["rank0_fails"]["error"] == "InfeasibleBudget"
    other = ranks[1]["rank0_fails"]
    assert other["error"] == "RankPlanningError"
    assert "rank 0 could not plan" in other["message"] and "InfeasibleBudget" in other["message"]


def test_plan_file_from_rank0_serves_every_rank(ranks):
    for result in ranks:
        scenario = result["plan_file"]
        assert scenario["written"]
        assert scenario["first"] == scenario["second"] == ranks[0]["plan_file"]["first"]


def _joint_on(device):
    import torch
    import torch.fx as fx

    from planner.graph import JointGraph

    graph = fx.Graph()
    x = graph.placeholder("primals_1")
    ones = graph.call_function(torch.ops.aten.full.default, ([4], 1.0), {"device": device, "dtype": torch.float32})
    graph.output((graph.call_function(torch.ops.aten.add.Tensor, (x, ones)),))
    return JointGraph(fx.GraphModule({}, graph), num_fwd_outputs=1)


def test_ranks_on_their_own_device_index_see_one_graph():
    """Rank r places its graph on cuda:r: the fingerprint names the device's type, not its index."""
    import torch

    rank0, rank1 = (_joint_on(torch.device("cuda", r)).fingerprint for r in (0, 1))
    assert rank0 == rank1
    assert _joint_on(torch.device("cpu")).fingerprint != rank0
