"""Estimators: the roofline's fused byte counts and rates, the profiler's cache and fallbacks."""
import json
import multiprocessing

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from estimators import available_estimators, get_estimator
from estimators.profile import ProfileEstimator
from planner.real_ops import merge_into_cache, read_cache, signature
from estimators.roofline import DATASHEET, RooflineEstimator, datasheet_rates, device_rates
from planner.errors import ConfigError


def _nodes(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return {str(n.target).split(".")[1]: n for n in gm.graph.nodes if n.op == "call_function"}


def _chain(x, y, w):
    return torch.mm(x.sin().cos() * y, w)


X, Y, W = torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 16)
BYTES = 64 * 32 * 4  # one [64, 32] float32 tensor


def test_every_estimator_is_selectable_by_name():
    assert available_estimators() == ["auto", "constant", "flops", "profile", "roofline"]
    for name in available_estimators():
        assert get_estimator(name).name == name


def test_roofline_costs_a_fused_pointwise_chain_as_one_memory_pass():
    nodes = _nodes(_chain, X, Y, W)
    est = RooflineEstimator(flops_per_second=1e30, bytes_per_second=1.0)  # seconds == bytes moved
    chain = [est.runtime(nodes[op]) for op in ("sin", "cos", "mul")]
    assert chain == [BYTES, 0.0, 2 * BYTES]  # sin reads x; cos is inlined; mul reads y, writes its output
    assert sum(chain) == 3 * BYTES  # x and y read once, the product written once
    unfused = RooflineEstimator(fuse=False, flops_per_second=1e30, bytes_per_second=1.0)
    assert [unfused.runtime(nodes[op]) for op in ("sin", "cos", "mul")] == [2 * BYTES, 2 * BYTES, 3 * BYTES]


def _rms_statistics(x, w):
    h = x.to(torch.float64)  # an RMSNorm's statistics: a reduction of a chain computed inside it
    return torch.mm((h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype), w)


def test_roofline_charges_a_reduction_the_loads_of_what_it_computes_inside_its_kernel():
    """The cast and the power are computed inside the mean's kernel, which loads ``x`` itself
    (a kernel of its own, besides the one normalising ``x``): the mean pays that load, the cast
    (read by pointwise ops only) and the power nothing of it."""
    nodes = _nodes(_rms_statistics, X, W)
    est = RooflineEstimator(flops_per_second=1e30, bytes_per_second=1.0)
    mean, cast, power = nodes["mean"], next(n for k, n in nodes.items() if "convert" in k or "_to_copy" in k), nodes["pow"]
    assert est.runtime(mean) == BYTES  # x (float32) loaded; the means are used in the kernel (its epilogue)
    assert est.runtime(power) == 0.0
    assert est.runtime(cast) == BYTES  # its own read of x, shared in a backward with a kernel that reads x anyway


def test_roofline_matrix_product_is_bound_by_the_slower_of_flops_and_bytes():
    mm = _nodes(_chain, X, Y, W)["mm"]
    flops, moved = 2 * 64 * 32 * 16, (64 * 32 + 32 * 16 + 64 * 16) * 4
    assert RooflineEstimator(flops_per_second=1.0, bytes_per_second=1e30).runtime(mm) == flops
    assert RooflineEstimator(flops_per_second=1e30, bytes_per_second=1.0).runtime(mm) == moved


def test_roofline_prices_an_op_at_the_rate_of_its_largest_operands_dtype():
    # bf16 operands beside a small float32 input (as an attention backward's log-sum-exp beside
    # its queries, keys and values) compute at the half-precision rate, not the float32 one
    from estimators.roofline import Rates, compute_dtype

    a, b, scale = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16), torch.randn(())
    gm = make_fx(lambda a, b, s: torch.mm(a * s, b), tracing_mode="fake")(a, b, scale)
    mul, mm = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert compute_dtype(mul, mul.meta["val"]) == torch.bfloat16
    est = RooflineEstimator()
    est.rates = Rates(2.0, 1.0, 1e30, 0.0)  # half-precision flops twice the single rate
    assert est.runtime(mm) == 2 * 64 * 32 * 16 / 2.0
    wide = make_fx(lambda a, b: torch.mm(a, b), tracing_mode="fake")(a.float(), b.float())
    (mm32,) = [n for n in wide.graph.nodes if n.op == "call_function"]
    assert compute_dtype(mm32, mm32.meta["val"]) == torch.float32 and est.runtime(mm32) == 2 * 64 * 32 * 16 / 1.0


def test_roofline_rates_from_the_datasheet_and_from_measurement():
    assert datasheet_rates("NVIDIA H100 80GB HBM3") is DATASHEET["H100"]
    assert datasheet_rates("NVIDIA H100 PCIe") is DATASHEET["H100 PCIe"]
    assert datasheet_rates("NVIDIA H200") is DATASHEET["H200"]
    assert datasheet_rates("NVIDIA A100-SXM4-80GB") is DATASHEET["A100"]
    assert datasheet_rates("Tesla T4") is None
    with pytest.raises(ConfigError, match="no datasheet rates for 'cpu'.*calibrate=true"):
        device_rates(torch.device("cpu"), calibrate=False)
    measured = device_rates(torch.device("cpu"))
    assert measured.half_flops > 0 and measured.single_flops > 0 and measured.bandwidth > 0
    with pytest.raises(ConfigError, match="both flops_per_second and bytes_per_second"):
        RooflineEstimator(flops_per_second=1e12)


def test_profile_measures_each_signature_once_and_reads_it_back_from_the_cache(tmp_path):
    nodes = list(_nodes(_chain, X, Y, W).values())
    first = ProfileEstimator(cache_dir=tmp_path, repeats=3, progress=False, fuse=False)
    first.prepare(nodes)
    assert (first.measured, first.cached, first.fallbacks) == (len(nodes), 0, {})
    assert all(first.runtime(n) > 0 for n in nodes)
    (cache_file,) = tmp_path.glob("profile-*.json")
    assert torch.__version__.split("+")[0] in cache_file.name and "cpu" in cache_file.name
    assert set(read_cache(cache_file, "seconds")) == {signature(n) for n in nodes}
    second = ProfileEstimator(cache_dir=tmp_path, progress=False, fuse=False)
    second.prepare(nodes)
    assert (second.measured, second.cached) == (0, len(nodes))
    assert [second.runtime(n) for n in nodes] == [first.runtime(n) for n in nodes]


def test_profile_with_inductor_measures_kernels_and_prices_fused_pointwise_ops_by_roofline(tmp_path):
    nodes = _nodes(_chain, X, Y, W)
    est = ProfileEstimator(cache_dir=tmp_path, repeats=3, progress=False)
    est.prepare(list(nodes.values()))
    assert est.measured == 1 and list(est.seconds) == [signature(nodes["mm"])]
    roofline = RooflineEstimator()
    assert [est.runtime(nodes[op]) for op in ("sin", "cos", "mul")] == [roofline.runtime(nodes[op]) for op in ("sin", "cos", "mul")]
    assert est.runtime(nodes["mm"]) == est.seconds[signature(nodes["mm"])] > 0


def test_profile_with_inductor_prices_reductions_by_roofline(tmp_path):
    nodes = _nodes(lambda x: x.sin().sum(dim=1), X)
    est = ProfileEstimator(cache_dir=tmp_path, repeats=3, progress=False)
    est.prepare(list(nodes.values()))
    assert est.measured == 0  # inductor generates the reduction: its eager time is not its cost
    assert est.runtime(nodes["sum"]) == RooflineEstimator().runtime(nodes["sum"]) > 0
    eager = ProfileEstimator(cache_dir=tmp_path, repeats=3, progress=False, fuse=False)
    eager.prepare(list(nodes.values()))
    assert signature(nodes["sum"]) in eager.seconds


def test_profile_with_inductor_prices_factories_by_roofline(tmp_path):
    # Inductor generates a factory op inside the kernels that read it: its eager time, a kernel
    # launch of its own, is not its cost.
    nodes = _nodes(lambda x: x + torch.arange(x.shape[1], dtype=x.dtype), X)
    (factory,) = [n for n in nodes.values() if n.op == "call_function" and not n.all_input_nodes]
    est = ProfileEstimator(cache_dir=tmp_path, repeats=3, progress=False)
    est.prepare(list(nodes.values()))
    assert est.measured == 0
    assert est.runtime(factory) == RooflineEstimator().runtime(factory)


def test_profile_signature_tells_shapes_and_dtypes_apart():
    a = _nodes(_chain, X, Y, W)["sin"]
    b = _nodes(_chain, X.double(), Y.double(), W.double())["sin"]
    c = _nodes(_chain, X[:32], Y[:32], W)["sin"]
    assert len({signature(a), signature(b), signature(c)}) == 3
    assert signature(a) == signature(_nodes(_chain, X, Y, W)["sin"])


_lib = torch.library.Library("acplan_test", "DEF")
_lib.define("opaque(Tensor x) -> Tensor")
torch.library.register_fake("acplan_test::opaque", lambda x: torch.empty_like(x), lib=_lib)


def test_profile_prices_ops_it_cannot_run_by_roofline_and_reports_them(tmp_path):
    nodes = _nodes(lambda x, w: torch.mm(torch.ops.acplan_test.opaque(x), w), X, W)
    est = ProfileEstimator(cache_dir=tmp_path, progress=False)
    est.prepare(list(nodes.values()))
    assert est.measured == 1 and list(est.fallbacks) == [signature(nodes["opaque"])]
    assert est.runtime(nodes["opaque"]) == RooflineEstimator().runtime(nodes["opaque"]) > 0
    assert "acplan_test.opaque.default: cannot run on real tensors" in est.report()
    cached = read_cache(next(tmp_path.glob("profile-*.json")), "seconds")
    assert list(cached) == [signature(nodes["mm"])]  # fallbacks are not cached


def _writer(path, tag, count):
    for i in range(count):
        merge_into_cache(path, "seconds", {f"{tag}{i}": float(i)})


def test_concurrent_cache_writers_keep_every_entry(tmp_path):
    path = tmp_path / "profile-x.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, tag, 40)) for tag in "abcd"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    data = json.loads(path.read_text())
    assert sorted(data["seconds"]) == sorted(f"{tag}{i}" for tag in "abcd" for i in range(40))
    assert not list(tmp_path.glob("*.tmp"))


class _SinSquare(torch.nn.Module):
    """``sin(x @ w) ** 2``: the backward reads the sine, which the forward fuses into the square."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64))

    def forward(self, x):
        return (torch.sin(x @ self.w) ** 2).sum()


def _sin_square_problem(save_cost):
    from planner.build import build_problem
    from planner.tracing import capture

    torch.manual_seed(0)
    model, x = _SinSquare(), torch.randn(128, 64)
    est = RooflineEstimator(flops_per_second=1e12, bytes_per_second=1e9, save_cost=save_cost)
    return model, x, build_problem(capture(model, (x,)), est, fuse=True)


def test_roofline_prices_saving_by_its_memory_traffic():
    from planner.bounds import runtime_optimal_plan

    _, _, problem = _sin_square_problem(save_cost=True)
    mm, sin = (problem.targets.index(f"aten.{op}.default") for op in ("mm", "sin"))
    nbytes = 128 * 64 * 4
    # The product is stored for the sine anyway and is no pointwise op, so the backward reads
    # it either way: saving it is free. The sine lives only inside fused kernels, forward and
    # backward: saving it costs a write and a read.
    assert problem.save_seconds[mm] == 0.0
    assert problem.save_seconds[sin] == pytest.approx(2 * nbytes / 1e9)
    # Run again in the backward, the sine fuses with the cosine of its gradient, which loads
    # the product anyway: it moves no bytes of its own.
    assert problem.runtime[sin] == 0.0
    fast = runtime_optimal_plan(problem)
    assert fast.saved[mm] and fast.recomputed[sin]
    assert fast.seconds < problem.save_seconds[sin]  # recomputing the sine beats saving it

    # Without save costs, a sine that costs nothing to run again is still recomputed (saving it
    # would hold bytes for no seconds), and a value that costs anything is saved.
    _, _, free = _sin_square_problem(save_cost=False)
    assert not free.save_seconds.any() and free.runtime[sin] == 0.0
    free_fast = runtime_optimal_plan(free)
    assert free_fast.recomputed[sin] and free_fast.saved[mm] and free_fast.seconds == 0.0


def test_plan_that_recomputes_to_save_bandwidth_trains_like_eager():
    import planner
    from tests.training import assert_same_step

    config = planner.PlannerConfig(codegen="eager", estimator="roofline", time_limit=5,
                                   estimator_options={"flops_per_second": 1e12, "bytes_per_second": 1e9})

    def make():
        model, x, _ = _sin_square_problem(save_cost=True)
        return model, (x,)

    def run_planned(twin, inputs):
        result = planner.plan(twin, inputs, memory_budget=1.0, config=config)
        assert "sin" not in " ".join(result.decision.saved)  # recomputed, not saved
        return result.module

    assert_same_step(make, run_planned)


class _Head(torch.nn.Module):
    """A linear layer and a cross-entropy loss: the forward reads the log-softmax only in the
    loss's gather of the targets' entries."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 512)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.lin(x), y)


def test_a_value_read_only_by_a_gather_is_not_stored_and_recomputing_it_beats_saving_it(monkeypatch):
    import planner.memory as memory
    from planner.bounds import runtime_optimal_plan
    from planner.build import build_problem
    from planner.tracing import capture

    # "cpu" stands in for a GPU: on a CPU inductor also stores the log-softmax, read by the
    # gather and by the softmax the backward needs, for its ``log`` (memory.stored_on_reuse)
    monkeypatch.setattr(memory, "_GPU_TYPES", ("cpu",))

    torch.manual_seed(0)
    x, y = torch.randn(256, 32), torch.randint(0, 512, (256,))
    est = RooflineEstimator(flops_per_second=1e30, bytes_per_second=1.0)  # seconds == bytes moved
    joint = capture(_Head(), (x, y), codegen="inductor")
    problem = build_problem(joint, est, fuse=True)
    log_softmax = next(i for i, node in enumerate(joint.forward_nodes)  # the gather's source
                       if any(r.target == torch.ops.aten.gather.default and r.args[0] is node for r in node.users))
    # Inductor lowers the gather to a kernel that computes the log-softmax entries it loads, so
    # the forward stores no log-softmax: saving it costs its write and its read in the backward.
    nbytes = 256 * 512 * 4
    assert problem.save_seconds[log_softmax] == 2 * nbytes
    fast = runtime_optimal_plan(problem)
    assert fast.recomputed[log_softmax] and not fast.saved[log_softmax]
    assert fast.seconds < problem.save_seconds[log_softmax]


def test_measurements_run_on_real_tensors_inside_torch_compiles_fake_mode(monkeypatch, tmp_path):
    # The planner's estimators run inside torch.compile's partitioner, under a FakeTensorMode,
    # where an op on tensors made there runs no kernel: timing it would time the dispatcher.
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    import estimators.profile as profile_module
    import estimators.roofline as roofline_module
    from estimators.timing import run_times

    outputs = []

    def spy(fn, device, repeats, warmup=1):
        outputs.append(fn())
        return run_times(fn, device, repeats, warmup)

    monkeypatch.setattr(profile_module, "run_times", spy)
    monkeypatch.setattr(roofline_module, "run_times", spy)
    mm = _nodes(_chain, X, Y, W)["mm"]
    with FakeTensorMode():
        assert isinstance(torch.randn(2), FakeTensor)
        est = ProfileEstimator(cache_dir=tmp_path, progress=False)
        est.runtime(mm)
        roofline_module.measure_rates.cache_clear()
        roofline_module.measure_rates("cpu")
    # the product is timed in a measuring process (no fake mode there); the three calibration
    # probes here, on real tensors
    assert est.measured == 1 and not est.fallbacks and est.seconds[signature(mm)] > 0
    assert len(outputs) == 3 and not any(isinstance(out, FakeTensor) for out in outputs)


def _fake_cuda_nodes():
    """Nodes whose values are CUDA tensors, traced with fake tensors (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(64, 32, device="cuda"), torch.empty(64, 32, device="cuda"), torch.empty(32, 16, device="cuda")]
    return _nodes(_chain, *args)


def test_auto_prices_cpu_graphs_with_flops_and_cuda_graphs_with_its_gpu_model():
    cpu = _nodes(_chain, X, Y, W)
    auto, flops = get_estimator("auto"), get_estimator("flops")
    auto.prepare(list(cpu.values()))
    assert str(auto) == "auto (flops)"
    assert [auto.runtime(n) for n in cpu.values()] == [flops.runtime(n) for n in cpu.values()]
    cuda = _fake_cuda_nodes()
    assert next(iter(cuda.values())).meta["val"].device.type == "cuda"
    on_gpu = get_estimator("auto", cuda="constant", seconds=2.0)  # the GPU model's options pass through
    on_gpu.prepare(list(cuda.values()))
    assert str(on_gpu) == "auto (constant)" and on_gpu.runtime(cuda["mm"]) == 2.0
    assert get_estimator("auto").by_device == {"cuda": "roofline", "other": "flops"}


def test_auto_refuses_an_unknown_or_recursive_choice():
    from planner.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="magic"):
        get_estimator("auto", cuda="magic")
    with pytest.raises(UnknownNameError, match="auto"):
        get_estimator("auto", other="auto")


def test_flops_of_grouped_query_attention_are_those_of_the_repeated_heads():
    # SDPA with enable_gqa passes keys and values with fewer heads than the query; torch 2.11's
    # counter asserts on them (2.13's counts them), so the estimator counts the repeated attention
    from estimators.flops import count_flops

    def attention(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)[0]

    q = torch.randn(2, 8, 32, 16)
    grouped = make_fx(attention, tracing_mode="fake")(q, torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16))
    repeated = make_fx(attention, tracing_mode="fake")(q, torch.randn(2, 8, 32, 16), torch.randn(2, 8, 32, 16))
    sdpa = [[n for n in g.graph.nodes if "scaled_dot_product" in str(n.target)][0] for g in (grouped, repeated)]
    assert count_flops(sdpa[0]) == count_flops(sdpa[1]) > 0


def test_the_cpu_attention_and_its_backward_are_counted_on_every_torch():
    # torch's counter has formulas for SDPA's CPU kernel only from 2.14 on; the estimator adds them
    from estimators.flops import count_flops

    def attention(q, k, v, grad):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0, True)

    q = torch.randn(2, 4, 32, 16)
    graph = make_fx(attention, tracing_mode="fake")(q, torch.randn_like(q), torch.randn_like(q), torch.randn_like(q))
    forward, backward = [n for n in graph.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert count_flops(backward) > count_flops(forward) > 0


def test_flops_are_counted_once_per_call_signature_and_tell_shapes_and_arguments_apart():
    from estimators import flops

    def layers(x, w, v):
        a = torch.mm(x, w)
        b = torch.mm(a, w)  # the same call as a's: counted once
        c = torch.mm(x, v)  # another shape
        k = w[None, None, :3, :3]
        d = torch.ops.aten.convolution(x[None, None], k, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        e = torch.ops.aten.convolution(x[None, None], k, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
        return b, c, d, e

    graph = make_fx(layers, tracing_mode="fake")(torch.randn(16, 16), torch.randn(16, 16), torch.randn(16, 64))
    mm = [n for n in graph.graph.nodes if n.target == torch.ops.aten.mm.default]
    conv = [n for n in graph.graph.nodes if n.target == torch.ops.aten.convolution.default]
    flops._COUNTED.clear()
    counts = [flops.count_flops(n) for n in mm + conv]
    assert counts[:3] == [2 * 16 * 16 * 16] * 2 + [2 * 16 * 16 * 64]
    assert counts[3] > counts[4] > 0  # stride 2 makes fewer outputs: the stride is in the signature
    assert len(flops._COUNTED) == 4


class _RepeatedKeys(torch.nn.Module):
    """Grouped-query attention as transformers writes it: keys and values repeated per query
    head (``expand`` then ``reshape``, a copy) and read by fused attention alone."""

    def __init__(self, d=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.head_dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        rep = self.heads // self.kv_heads
        k, v = (t[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)
                for t in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()


def test_a_value_laid_out_by_fused_attention_is_free_to_save_and_costs_its_copy_to_recompute():
    from planner.bounds import runtime_optimal_plan
    from planner.build import build_problem
    from planner.memory import copies_inputs, readers
    from planner.tracing import capture

    torch.manual_seed(0)
    joint = capture(_RepeatedKeys(), (torch.randn(2, 16, 32),), codegen="inductor")
    est = RooflineEstimator(flops_per_second=1e30, bytes_per_second=1.0)  # seconds == bytes moved
    problem = build_problem(joint, est, fuse=True)
    forward = list(joint.forward_nodes)
    repeated = [i for i, node in enumerate(forward) if node.target == torch.ops.aten.clone.default
                and readers(node) and all(copies_inputs(r) for r in readers(node))]
    assert len(repeated) == 2  # the repeated keys and values, read by the attention and its backward
    nbytes = 2 * 4 * 16 * 8 * 4
    for i in repeated:
        # Inductor computes the copy for the attention in the forward whether or not it is saved,
        # and the attention's backward reads a saved copy as it is: saving moves no more bytes.
        # Recomputed, the backward makes the copy again.
        assert problem.save_seconds[i] == 0.0
        assert problem.runtime[i] >= nbytes
    fast = runtime_optimal_plan(problem)
    assert all(fast.saved[i] for i in repeated)


def test_pricing_a_joint_graph_asks_each_question_of_it_once_and_gets_the_same_answers(monkeypatch):
    """The problem's prices and the step's estimate are made inside one walk of the graph
    (:func:`planner.memory.graph_unchanged`), each question of the memory model answered once:
    the same figures as asking each afresh, which pricing every node did before."""
    import contextlib

    import numpy as np

    from planner import memory
    from planner.build import build_problem, estimate_step_seconds
    from planner.tracing import capture
    from tests.models import gpt

    model, batch = gpt()
    joint = capture(model, batch, codegen="inductor")

    def priced():
        roofline = RooflineEstimator(calibrate=False, flops_per_second=1e14, bytes_per_second=2e12)
        problem = build_problem(joint, roofline, fuse=True)
        return problem.runtime, problem.save_seconds, estimate_step_seconds(joint, roofline)

    walked = priced()
    monkeypatch.setattr(memory, "_graphs_unchanged", contextlib.nullcontext)  # every question walks afresh
    afresh = priced()
    assert walked[2] == afresh[2] > 0
    for ours, theirs in zip(walked[:2], afresh[:2]):
        np.testing.assert_array_equal(ours, theirs)
    assert walked[1].any()  # the roofline prices saving: the save-cost questions were asked too
