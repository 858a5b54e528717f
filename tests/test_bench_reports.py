"""The benchmarks' reports: targets decided from the rows, files written from merged runs."""
import json

import pytest

from bench.pareto import main, targets

GIB = 2**30


def _row(method, budget, gib, ms, solver=None):
    return {"model": "gpt", "method": method, "solver": solver, "budget": budget,
            "peak_activation_bytes": int(gib * GIB), "step_ms": ms}


def test_targets_count_dominated_points_and_the_small_memory_point():
    rows = [_row("torch.compile", 1.0, 4.0, 28.0), _row("torch.compile", 0.0, 2.5, 36.0),
            _row("planner", 1.0, 3.9, 28.5, "cpsat"), _row("planner", 0.0, 1.9, 35.0, "cpsat")]
    text = "\n".join(targets(rows))
    assert "Dominated torch.compile points: 1 of 2" in text  # 28.5 ms > 28.0 ms at budget 1
    assert "| 1 | 4.000 / 28.0 | planner cpsat at 1: 3.900 GiB / 28.5 ms | 1.018 | no |" in text
    assert "| 0 | 2.500 / 36.0 | planner cpsat at 0: 1.900 GiB / 35.0 ms | 0.972 | yes |" in text
    assert "no more step time: 1 (least memory: planner cpsat at 0, 1.900 GiB = 0.76x, 35.0 ms)" in text


def test_no_planner_point_small_enough_is_reported():
    rows = [_row("torch.compile", 0.0, 2.0, 30.0), _row("planner", 0.0, 1.7, 29.0, "greedy")]
    text = "\n".join(targets(rows))
    assert "no more step time: 0 (target: at least one)" in text  # 1.7 > 0.8 * 2.0


def test_report_merges_runs_into_json_markdown_and_png(tmp_path):
    parts = []
    for i, rows in enumerate([[_row("eager", None, 5.0, 30.0), _row("torch.compile", 0.5, 3.0, 31.0)],
                              [_row("planner", 0.5, 2.9, 30.5, "cpsat"), _row("planner", 0.0, 1.5, 33.0, "cpsat")]]):
        path = tmp_path / f"part{i}.json"
        path.write_text(json.dumps({"device": "GPU X", "torch": "2.11", "rows": rows}))
        parts.append(str(path))
    main(["--report", *parts, "--out", str(tmp_path / "merged")])
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert [r["method"] for r in merged["rows"]] == ["eager", "torch.compile", "planner", "planner"]
    table = (tmp_path / "merged.md").read_text()
    assert "| planner cpsat | 0.5 | 2.900 | 30.5 |" in table and "Dominated torch.compile points: 1 of 1" in table
    assert (tmp_path / "merged.png").read_bytes()[:4] == b"\x89PNG"


def _plan(estimator, budget, predicted_ms, step_ms, role="plan"):
    return {"role": role, "estimator": estimator, "budget": budget, "recompute_seconds": predicted_ms / 1e3,
            "step_ms": step_ms, "peak_activation_bytes": GIB, "status": "optimal"}


def test_estimator_summary_ranks_errors_and_compares_with_flops():
    from bench.estimators import summarise

    rows = [_plan("flops", 1.0, 0.0, 30.0, "baseline"), _plan("flops", 1.0, 0.0, 30.2, "baseline")]
    for budget, measured in [(0.8, 1.0), (0.4, 2.0), (0.0, 4.0)]:
        rows.append(_plan("roofline", budget, measured * 1.1, 30.1 + measured))  # same order, 10% high
        rows.append(_plan("flops", budget, 5.0 - measured, 30.1 + measured + 0.5))  # reversed order
    text = "\n".join(summarise(rows))
    assert "median 30.10; spread 0.20 ms" in text
    assert "| roofline | 1.00 | 10% | met |" in text
    assert "| flops | -1.00 |" in text
    assert "| 0.4 | 32.60 | 0.985 |" in text  # roofline's plan 0.5 ms faster than flops' at budget 0.4


def test_points_planned_at_torch_compiles_memory_are_their_own_curve():
    rows = [_row("torch.compile", 0.8, 3.2, 30.0),
            {**_row("planner", int(3.2 * GIB), 3.0, 29.5, "cpsat"), "matched": 0.8}]
    text = "\n".join(targets(rows))
    assert "| 0.8 | 3.200 / 30.0 | planner cpsat at torch 0.8's memory (3.200 GiB): 3.000 GiB / 29.5 ms | 0.983 | yes |" in text


def test_each_benchmark_point_keeps_its_own_compiled_graph():
    # One backend compiling two copies of a model: behind their own frames each gets its own
    # graph, so points compiled under different settings never share one.
    import copy

    import torch
    import torch.nn as nn

    from bench.workloads import own_frame

    compiled, ran = [], []

    def backend(gm, example_inputs):
        k = len(compiled)
        compiled.append(gm)

        def run(*args):
            ran.append(k)
            return gm(*args)
        return run

    base, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4)
    first, second = (torch.compile(own_frame(copy.deepcopy(base)), backend=backend) for _ in range(2))
    for _ in range(2):
        torch.testing.assert_close(first(x), base(x))
        second(x)
    assert len(compiled) == 2 and ran == [0, 1, 0, 1]


def test_solver_bench_solves_the_same_budgets_in_a_later_run(tmp_path, monkeypatch, capsys):
    from bench import solvers as bench_solvers
    from solvers import frugal

    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path / "cache"))
    runs = []
    for run in range(2):
        monkeypatch.setattr(frugal, "_FOUND", {})  # a new process: only the disk remembers
        out = tmp_path / f"run{run}.json"
        bench_solvers.main(["--layers", "1", "--budgets", "0.5", "--methods", "greedy", "--time-limit", "5",
                            "--out", str(out)])
        runs.append(json.loads(out.read_text())["rows"])
    printed = capsys.readouterr().out
    (first,), (second,) = runs
    assert first["frugal_cache"] is None and second["frugal_cache"] is not None
    assert second["frugal_cache"] in printed and "searched in this run" in printed
    assert second["budget_bytes"] == first["budget_bytes"] and second["frugal_peak_bytes"] == first["frugal_peak_bytes"]
    assert first["method"] == "greedy" and first["objective"] > 0


def test_zoo_target_a_quotes_the_tensors_requested_peaks_beside_the_allocated_ones():
    from bench.zoo import targets as zoo_targets

    gib = 2**30
    rows = [{"model": "m", "method": "torch.compile", "budget": 1.0, "peak_activation_bytes": 2 * gib,
             "peak_requested_bytes": gib, "step_ms": 10.0},
            {"model": "m", "method": "planner", "budget": 1.0, "peak_activation_bytes": 2 * gib + 4096,
             "peak_requested_bytes": gib, "step_ms": 10.0}]
    line = zoo_targets(rows)[0]
    assert line.startswith("(a) NOT met")  # decided by the allocator's bytes, as measured
    assert "requested peaks 1.0000 against 1.0000 GiB" in line
    del rows[0]["peak_requested_bytes"]  # runs from before the field: no such clause
    assert "requested" not in zoo_targets(rows)[0]


def test_zoo_target_a_says_when_the_hosts_launches_bound_the_steps():
    from bench.zoo import targets as zoo_targets

    rows = [{"model": "m", "method": "torch.compile", "budget": 1.0, "peak_activation_bytes": 100, "step_ms": 10.0,
             "kernel_ms": 8.0, "host_ms": 9.5},
            {"model": "m", "method": "planner", "budget": 1.0, "peak_activation_bytes": 100, "step_ms": 10.4,
             "kernel_ms": 8.0, "host_ms": 9.9}]
    line = zoo_targets(rows)[0]
    assert line.startswith("(a) NOT met") and "GPU busy 1.000x" in line
    assert "launches 9.9 of 10.4 ms: bound by the host" in line
    for row in rows:
        row["host_ms"] = 2.0  # the GPU's work sets the step: no such clause
    line = zoo_targets(rows)[0]
    assert "GPU busy 1.000x" in line and "host" not in line


def test_zoo_target_a_names_the_kernels_behind_a_busier_gpu():
    from bench.gpu_step import kernel_name
    from bench.zoo import targets as zoo_targets

    copy = "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>(int, Functor)"
    assert kernel_name(copy) == "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>"
    assert kernel_name("triton_red_fused_native_batch_norm_backward_12") == "triton_red_fused_native_batch_norm_backward"
    depthwise = "void at::native::(anonymous namespace)::conv_depthwise2d_grad_weight_kernel<c10::BFloat16, float>(int)"
    assert kernel_name(depthwise) == "void at::native::conv_depthwise2d_grad_weight_kernel<c10::BFloat16, float>"
    mine = {"copy": [1.321, 24], "triton_red_bn": [1.06, 3], "triton_poi_add": [0.389, 4], "gemm": [6.5, 125]}
    theirs = {"copy": [0.141, 18], "triton_poi_add": [0.742, 7], "gemm": [6.5, 125]}
    rows = [{"model": "m", "method": "torch.compile", "budget": 1.0, "peak_activation_bytes": 100, "step_ms": 25.4,
             "kernel_ms": 22.9, "host_ms": 19.0, "kernel_names": theirs},
            {"model": "m", "method": "planner", "budget": 1.0, "peak_activation_bytes": 100, "step_ms": 27.9,
             "kernel_ms": 24.8, "host_ms": 19.0, "kernel_names": mine}]
    line = zoo_targets(rows)[0]
    assert line.startswith("(a) NOT met")
    assert "differing most: `copy` 0.141 -> 1.321 ms, `triton_red_bn` 0.000 -> 1.060 ms, `triton_poi_add` 0.742 -> 0.389 ms" in line
    rows[1]["kernel_ms"] = 22.9  # as busy as torch.compile's: nothing to explain
    assert "differing" not in zoo_targets(rows)[0]


def test_zoo_target_c_gives_budget_zeros_gpu_time_and_launches_against_torch_compiles():
    from bench.zoo import targets as zoo_targets

    rows = [{"model": "m", "method": "library checkpointing", "peak_activation_bytes": 50, "step_ms": 30.0},
            {"model": "m", "method": "torch.compile", "budget": 1.0, "peak_activation_bytes": 100, "step_ms": 10.0,
             "kernel_ms": 8.0, "host_ms": 9.0, "launches": 700},
            {"model": "m", "method": "planner", "budget": 0.0, "peak_activation_bytes": 40, "step_ms": 14.0,
             "kernel_ms": 10.0, "host_ms": 13.0, "launches": 1000}]
    line = next(line for line in zoo_targets(rows) if line.startswith("(c)"))
    assert line.startswith("(c) NOT met") and "1.400x torch.compile 1.0's time" in line
    assert "GPU busy 1.250x, 1000 launches against 700" in line and "bound by the host" in line
    del rows[2]["launches"]  # runs from before the field: no count
    assert "launches against" not in next(line for line in zoo_targets(rows) if line.startswith("(c)"))


def test_zoo_target_c_without_library_checkpointing_is_the_time_alone():
    from bench.zoo import targets as zoo_targets

    rows = [{"model": "m", "method": "torch.compile", "budget": 1.0, "peak_activation_bytes": 100, "step_ms": 10.0},
            {"model": "m", "method": "planner", "budget": 0.0, "peak_activation_bytes": 40, "step_ms": 12.0}]
    line = next(line for line in zoo_targets(rows) if line.startswith("(c)"))
    assert line.startswith("(c) met for the time alone") and "no library checkpointing was measured" in line
    rows[1]["step_ms"] = 14.0
    assert next(line for line in zoo_targets(rows) if line.startswith("(c)")).startswith("(c) NOT met for the time alone")


def test_a_method_that_failed_is_named_in_the_targets_and_left_out_of_them():
    from bench.zoo import _row, targets as zoo_targets

    rows = [{"model": "m", "method": "torch.compile", "budget": 1.0, "error": "RuntimeError: (*bias): last dimension"},
            {"model": "m", "method": "planner", "budget": 0.0, "peak_activation_bytes": 40, "step_ms": 12.0,
             "predicted_peak_bytes": 40}]
    lines = zoo_targets(rows)
    assert lines[0] == "torch.compile at 1 failed: RuntimeError: (*bias): last dimension"
    assert not any(line.startswith(("(a)", "(c)")) for line in lines)  # nothing to compare with
    assert "(b) met: 0 of 0" in "\n".join(lines) and "(d) met" in "\n".join(lines)
    assert _row(rows[0]).endswith("| failed |") and "| - | - |" in _row(rows[0])


def test_a_model_whose_library_has_no_checkpointing_says_so(monkeypatch):
    import torch.nn as nn

    from bench import zoo_models

    class Refusing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = self

        def set_grad_checkpointing(self, enable: bool = True) -> None:
            assert False, "gradient checkpointing not supported"  # as timm's Inception-v3 refuses

    monkeypatch.setitem(zoo_models.MODELS, "refusing", zoo_models.ZooModel(lambda size: (Refusing(), ()), "timm", "-"))
    with pytest.raises(NotImplementedError, match="timm has no gradient checkpointing for refusing"):
        zoo_models.library_checkpointing("refusing", Refusing())


def test_cold_solver_bench_leaves_the_cache_setting(tmp_path, monkeypatch):
    """Each cold plan gets an empty cache directory of its own, and the process's setting is
    as it was after the bench (it was left pointing at a deleted directory)."""
    import os

    from bench.solvers import cold

    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path / "mine"))
    rows = cold([1], [0.5], ["greedy"], time_limit=5, repeats=1)
    assert len(rows) == 1 and rows[0]["method"] == "greedy" and rows[0]["cold_seconds"] > 0
    assert os.environ["ACPLAN_CACHE_DIR"] == str(tmp_path / "mine")
    monkeypatch.delenv("ACPLAN_CACHE_DIR")
    cold([1], [0.5], ["greedy"], time_limit=5, repeats=1)
    assert "ACPLAN_CACHE_DIR" not in os.environ


def test_plan_time_bench_times_the_parts_and_a_cold_plan_and_leaves_the_cache_setting(tmp_path, monkeypatch, capsys):
    import os

    import pytest

    pytest.importorskip("transformers")
    from bench import plan_time

    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path / "mine"))
    out = tmp_path / "plan_time.json"
    plan_time.main(["--models", "bert", "--size", "tiny", "--budgets", "0.5", "--repeats", "2", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "bert" and row["budget"] == 0.5 and row["nodes"] > 0
    assert 0 < row["simulation_seconds_least"] <= row["simulation_seconds_median"]
    assert row["predicted_peak_bytes"] > 0 and row["plan_seconds"] > 0
    assert os.environ["ACPLAN_CACHE_DIR"] == str(tmp_path / "mine")  # the cold plan's cache was its own
    assert not (tmp_path / "mine").exists()
    assert "| bert |" in capsys.readouterr().out


def test_plan_time_bench_prices_with_a_gpus_datasheet_rates_when_asked(tmp_path, capsys):
    import pytest

    pytest.importorskip("transformers")
    from bench import plan_time

    out = tmp_path / "plan_time.json"
    plan_time.main(["--models", "bert", "--size", "tiny", "--budgets", "1", "--repeats", "1", "--prices", "H100",
                    "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["estimator"].startswith("roofline") and row["plan_estimator"] == row["estimator"]
    assert "H100 datasheet rates" in capsys.readouterr().out


def test_plan_time_bench_plans_a_model_that_graph_breaks_graph_by_graph(tmp_path, capsys):
    import pytest

    pytest.importorskip("transformers")
    from bench import plan_time

    out = tmp_path / "plan_time.json"
    plan_time.main(["--models", "gpt2-breaks", "--size", "tiny", "--budgets", "0.5", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["graphs"] >= 2 and row["plan_seconds"] > 0 and row["predicted_peak_bytes"] > 0
    assert f"| gpt2-breaks | {row['graphs']} graphs," in capsys.readouterr().out


def test_compile_variants_reads_inductor_settings_as_their_types():
    from bench.compile_variants import _parse

    assert _parse("realize_opcount_threshold=30") == ("realize_opcount_threshold", 30)
    assert _parse("allow_buffer_reuse=True") == ("allow_buffer_reuse", True)
    assert _parse("realize_opcount_threshold=None") == ("realize_opcount_threshold", None)
    assert _parse("cpp.simdlen=-1") == ("cpp.simdlen", -1)


def test_zoo_names_the_values_inductor_stored_that_the_memory_model_fused():
    from bench.zoo import _stores_line

    mib = 2**20
    one = {"forward": {"unmodelled": {}, "unstored": {"add": mib}},
           "backward": {"unmodelled": {"mul_572": 294 * mib, "sum_1": mib // 2}, "unstored": {}}}
    line = _stores_line({"stores_against_inductor": [one]})
    assert "forward 0.0 MiB in 0;" in line and "backward 294.5 MiB in 2 (mul_572 294.0, sum_1 0.5)" in line
    assert "predicted with them stored" not in line
    line = _stores_line({"stores_against_inductor": [one], "predicted_compiled_peak_bytes": 3 * 2**29})
    assert line.endswith("; predicted with them stored 1.500 GiB")
    line = _stores_line({"stores_against_inductor": [one, {"backward": {"error": "not read: KeyError: x"}}]})
    assert "backward 294.5 MiB in 2 (0:mul_572 294.0, 0:sum_1 0.5), not read: KeyError: x" in line


def test_zoo_target_d_gives_the_compiled_predictions_error_beside_the_plans():
    from bench.zoo import targets as zoo_targets

    rows = [{"model": "m", "method": "planner", "budget": 0.0, "peak_activation_bytes": 100, "step_ms": 12.0,
             "predicted_peak_bytes": 80},
            {"model": "m", "method": "planner", "budget": 1.0, "peak_activation_bytes": 200, "step_ms": 10.0,
             "predicted_peak_bytes": 198}]
    line = next(line for line in zoo_targets(rows) if line.startswith("(d)"))
    assert line == "(d) NOT met: predicted peak error -20.0% to -1.0%"
    rows[0]["predicted_compiled_peak_bytes"], rows[1]["predicted_compiled_peak_bytes"] = 99, 202
    line = next(line for line in zoo_targets(rows) if line.startswith("(d)"))
    assert line.startswith("(d) NOT met: predicted peak error -20.0% to -1.0% (counting what inductor's code stores")
    assert line.endswith("-1.0% to +1.0%)")


def test_zoo_target_b_names_the_planner_points_it_was_judged_on():
    """A run of budget 0 alone cannot dominate torch.compile's 1.0 at its time: the verdict says
    which planner points it weighed."""
    from bench.zoo import targets as zoo_targets

    rows = [{"model": "m", "method": "torch.compile", "budget": 1.0, "peak_activation_bytes": 100, "step_ms": 10.0},
            {"model": "m", "method": "planner", "budget": 0.0, "peak_activation_bytes": 40, "step_ms": 12.0}]
    line = next(line for line in zoo_targets(rows) if line.startswith("(b)"))
    assert line == "(b) NOT met: 0 of 1 torch.compile points dominated by the planner's points measured (budgets 0)"
    rows.append({"model": "m", "method": "planner", "budget": 1.0, "peak_activation_bytes": 90, "step_ms": 10.0})
    line = next(line for line in zoo_targets(rows) if line.startswith("(b)"))
    assert line == "(b) met: 1 of 1 torch.compile points dominated by the planner's points measured (budgets 0, 1)"


class _Allocator:
    """torch.cuda's memory counters for a CPU test: bytes allocated now, their peak since the
    last reset, and the same for the bytes the tensors asked for."""

    def __init__(self):
        self.now = self.peak = self.asked = self.asked_peak = 0

    def take(self, allocated: int, asked: int) -> None:
        self.now, self.asked = self.now + allocated, self.asked + asked
        self.peak, self.asked_peak = max(self.peak, self.now), max(self.asked_peak, self.asked)

    def synchronize(self):
        pass

    def empty_cache(self):
        pass

    def memory_allocated(self):
        return self.now

    def max_memory_allocated(self):
        return self.peak

    def reset_peak_memory_stats(self):
        self.peak, self.asked_peak = self.now, self.asked

    def memory_stats(self):
        return {"requested_bytes.all.current": self.asked, "requested_bytes.all.peak": self.asked_peak}


def test_every_runs_peaks_are_measured_again_once_all_are_built_the_first_kept_alone(monkeypatch):
    import bench.gpu_step as gpu_step

    cuda = _Allocator()
    monkeypatch.setattr(gpu_step.torch, "cuda", cuda)
    monkeypatch.setattr(gpu_step, "retime", lambda runs, batch, rounds, steps: [7.0 + k for k in range(len(runs))])
    measured = []

    def run_of(asked: int):
        def run(x):
            cuda.take(asked, asked)

            class Loss:
                def backward(self):
                    cuda.take(-asked, -asked)
                    measured.append(asked)
            return Loss()
        return run

    runs = [(run_of(1000), []), (run_of(1000), []), (run_of(300), [])]
    # the first measures: the allocator gave the first step's request a block 512 bytes larger
    rows = [{"peak_activation_bytes": 1512, "step_ms": 9.0}, {"peak_activation_bytes": 1000, "step_ms": 9.5}]
    times = gpu_step.again_together(rows, runs, (None,), rounds=1, steps=3)
    assert times == [7.0, 8.0, 9.0]  # every run timed, the one past the rows too
    assert [r["peak_activation_bytes"] for r in rows] == [1000, 1000]  # both in one allocator state
    assert [r["peak_activation_bytes_alone"] for r in rows] == [1512, 1000]
    assert [r["peak_requested_bytes"] for r in rows] == [1000, 1000]
    assert [(r["step_ms_alone"], r["step_ms"]) for r in rows] == [(9.0, 7.0), (9.5, 8.0)]
    assert measured == [1000, 1000]  # the run past the rows has no peaks to measure
    assert gpu_step.again_together(rows, runs, (None,), rounds=0, steps=3) == []
    assert [r["step_ms"] for r in rows] == [7.0, 8.0]  # not timed again without rounds
