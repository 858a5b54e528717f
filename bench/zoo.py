"""Real models at default settings: transformers and timm models against torch.compile.

Per model (``bench/zoo_models.py``), in one process on one GPU, bf16 (or, with ``--autocast``,
float32 weights and every forward inside ``torch.autocast`` to bf16): eager; the library's own
gradient checkpointing (eager); ``torch.compile`` at PyTorch's ``activation_memory_budget``
values (``--torch-budgets``); and the planner at its defaults (``planner.compile`` with only
``memory_budget`` set) at ``--budgets`` and at each torch.compile point's measured peak given as
an absolute budget. Every point stays compiled; once all are built, each one's peaks are
measured again (the first measure of a step depends on what the process allocated before it,
:func:`bench.gpu_step.again_together`; the first figures are kept as ``*_alone``) and all are
timed again in ``--rounds`` interleaved rounds (as ``bench/pareto.py`` does); ``step_ms`` is the
median of those steps. A second eager copy is timed last in every round: ``spread_ms`` is half
the difference between the two eager medians, the run's noise as eager shows it (compiled points
can vary more).
Then per point, where the step's time goes (:func:`bench.gpu_step.kernel_and_host`): the GPU's
busy time, the GPU work it launches (kernels, copies, fills) and the host's launch time per step.
Where the launches take most of the step, step times follow the host's speed, not the plan's
kernels; the lines of targets (a) and (c) say so. Where the planner's point keeps the GPU busier
than torch.compile's, they name the three kernels (by name, :func:`bench.gpu_step.kernel_name`)
whose GPU time differs most.

Per planner point: measured peak activation memory, the predicted peak of the step (every graph
the model compiled into, :attr:`planner.compiler.PlannerBackend.predicted_step_peak`), the
number of graphs, the estimator that ran, plan seconds and the solvers' status.

Writes ``<out>.json`` and ``<out>.md`` (a table per model and the issue's targets).

    python -m bench.zoo [--models gpt2 llama vit resnet50] [--budgets 1 0.5 0.2 0] [--max-seconds 480]
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

from bench import fastest_within, merge_runs, save_rows

RESULTS = Path(__file__).parent / "results"
GIB = 2**30
MIB = 2**20
TORCH_BUDGETS = [1.0, 0.5, 0.2, 0.0]
BUDGETS = [1.0, 0.5, 0.2, 0.0]
HOST_BOUND = 0.8  # a step whose launches take this share of its time waits on the host
TIME_SLACK = 1.01  # the targets' "at most 1.01x its time"


def run_model(name: str, args, rows: list[dict], save) -> None:
    """Measure every method on one model, appending rows (timed again together at the end)."""
    import torch

    import planner
    from bench.gpu_step import again_together, kernel_and_host, measure
    from bench.zoo_models import build, library_checkpointing

    base, batch = build(name, "bench", device="cuda", dtype=torch.float32 if args.autocast else torch.bfloat16)
    kept: list = []
    mine: list[dict] = []

    def record(row: dict, run, model, details=dict) -> None:
        params = list(model.parameters())
        if args.autocast:
            run, row["autocast"] = under_autocast(run), "bfloat16"
        start = time.perf_counter()
        try:
            row.update(measure(run, params, batch, args.steps), first_step_seconds=time.perf_counter() - start)
        except Exception as err:  # noqa: BLE001  (said in the table; the other methods still run)
            failed(row, err)
            return
        row.update(details())
        kept.append((run, params))
        mine.append({"model": name, **row})
        rows.append(mine[-1])
        save()
        print(_row(mine[-1]), flush=True)
        print(_forward_line(mine[-1]), flush=True)
        if mine[-1].get("stores_against_inductor"):
            print(_stores_line(mine[-1]), flush=True)

    def failed(row: dict, err: Exception) -> None:
        """A method whose step raised: its row says why (the last line of the error), holds no
        figures, and is not timed again; a compiler's failure on a model is a finding, not a
        reason to stop measuring the others."""
        reason = (str(err).strip().splitlines() or [""])[-1][:300]
        rows.append({"model": name, **row, "error": f"{type(err).__name__}: {reason}"})
        save()
        print(f"| {name} | {row['method']} at {budget_text(row)}: failed, {rows[-1]['error']} |", flush=True)
        torch.cuda.empty_cache()

    def out_of_time(what: str) -> bool:
        """Past ``--max-seconds``: ``what`` is skipped (said), so the run keeps time to retime
        what it measured and write its tables before the device call ends."""
        late = past_deadline(args)
        if late:
            print(f"| {name} | {what}: skipped, past --max-seconds |", flush=True)
        return late

    def planner_point(budget, matched=None) -> None:
        if out_of_time(f"planner at {budget}"):
            return
        model = copy.deepcopy(base)
        compiled = planner.compile(model, memory_budget=budget, time_limit=args.time_limit)
        backend = compiled.planner_backend

        def details() -> dict:
            forward_peak, held = backend.predicted_forward
            return {"predicted_peak_bytes": backend.predicted_step_peak, "predicted_forward_peak_bytes": forward_peak,
                    "predicted_held_bytes": held, "graphs": len(backend.graphs),
                    "estimator": backend.graphs[0].estimator if backend.graphs else None,
                    "plan_seconds": sum(g.plan_seconds for g in backend.graphs),
                    "status": ",".join(sorted({g.decision.status for g in backend.graphs})),
                    "predicted_added_ms": 1e3 * sum(g.decision.seconds for g in backend.graphs),
                    "polish": [g.decision.stats.get("polish") for g in backend.graphs],
                    "time_limits": [g.decision.stats.get("time_limit") for g in backend.graphs],
                    "pytorch_split_seconds": [g.decision.stats.get("pytorch_split_seconds") for g in backend.graphs],
                    "fast_end_kernels": [g.decision.stats.get("fast_end_kernels") for g in backend.graphs],
                    "stores_against_inductor": backend.stores_against_inductor(),
                    "predicted_compiled_peak_bytes": backend.compiled_step_peak,
                    "polish_restores": backend.polish_restores,
                    "fusions_refused": backend.fusions_refused.refused,
                    "fusions_refused_across": backend.fusions_refused.refused_across}
        record({"method": "planner", "budget": budget, "matched": matched}, compiled, model, details)

    print(f"## {name}: {_description(name)}", flush=True)
    print(_HEADER, flush=True)
    model = copy.deepcopy(base)
    record({"method": "eager"}, model, model)
    try:
        model = library_checkpointing(name, copy.deepcopy(base))
    except NotImplementedError as err:  # said in the table; target (c) is then the time alone
        print(f"| {name} | library checkpointing: {err} |", flush=True)
    else:
        record({"method": "library checkpointing"}, model, model)
    for budget in args.torch_budgets:
        if out_of_time(f"torch.compile at {budget}"):
            continue
        model = copy.deepcopy(base)
        with torch._functorch.config.patch(activation_memory_budget=budget):
            record({"method": "torch.compile", "budget": budget}, torch.compile(planner.own_frame(model)), model)
    for budget in args.budgets:
        planner_point(budget)
    for t in [r for r in mine if r["method"] == "torch.compile" and args.matched]:
        planner_point(int(t["peak_activation_bytes"]), matched=t["budget"])
    if args.rounds:
        model = copy.deepcopy(base)
        # eager again, last: the run's noise
        kept.append((under_autocast(model) if args.autocast else model, list(model.parameters())))
    times = again_together(mine, kept, batch, args.rounds, args.steps)
    if args.rounds:
        mine[0]["spread_ms"] = abs(times[-1] - times[0]) / 2
        for row, (run, params) in zip(mine, kept):
            row.update(kernel_and_host(run, params, batch))
    save()  # the peaks measured again, with or without rounds
    print(_HEADER)
    print("\n".join(map(_row, mine)), flush=True)
    del base, kept
    torch.cuda.empty_cache()


def under_autocast(run):
    """``run`` with its forward inside ``torch.autocast("cuda", torch.bfloat16)``, as mixed-precision
    training loops call a model of float32 weights (the backward runs outside it, as theirs do)."""
    import torch

    def step(*batch):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return run(*batch)

    return step


def past_deadline(args) -> bool:
    """Whether the run is past ``--max-seconds`` (``args.deadline``, a ``time.monotonic`` time)."""
    return args.deadline is not None and time.monotonic() > args.deadline


def _description(name: str) -> str:
    from bench.zoo_models import spec

    return spec(name).description


_HEADER = ("| model | method | budget | peak activation GiB | step ms | GPU busy ms | GPU launches | host ms | predicted GiB "
           "| graphs | estimator | plan s | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def budget_text(row: dict) -> str:
    if row.get("matched") is not None:
        return f"{row['budget'] / GIB:.3f} GiB (torch {row['matched']:g})"
    return "-" if row.get("budget") is None else f"{row['budget']:g}"


def _row(row: dict) -> str:
    def fmt(key, scale=1.0, spec=".3f"):
        return "-" if row.get(key) is None else format(row[key] / scale, spec)

    return (f"| {row['model']} | {row['method']} | {budget_text(row)} | {fmt('peak_activation_bytes', GIB)} "
            f"| {fmt('step_ms', spec='.1f')} | {fmt('kernel_ms', spec='.1f')} | {fmt('launches', spec='.0f')} "
            f"| {fmt('host_ms', spec='.1f')} "
            f"| {fmt('predicted_peak_bytes', GIB)} | {row.get('graphs', '-')} "
            f"| {row.get('estimator') or '-'} | {fmt('plan_seconds', spec='.1f')} "
            f"| {row.get('status') or ('failed' if row.get('error') else '-')} |")


def _forward_line(row: dict) -> str:
    """The forward's peak and what it keeps for the backward, measured and (planner) predicted, GiB."""
    def gib(key):
        return "-" if row.get(key) is None else f"{row[key] / GIB:.3f}"

    refused = ("" if row.get("fusions_refused") is None else
               f"; fusions refused in planned backwards {row['fusions_refused']} ({row['fusions_refused_across']} across layers)")
    return (f"  forward peak {gib('forward_peak_bytes')} (predicted {gib('predicted_forward_peak_bytes')}), "
            f"held for the backward {gib('held_after_forward_bytes')} (predicted {gib('predicted_held_bytes')}){refused}")


def _stores_line(row: dict, shown: int = 3) -> str:
    """The values inductor's code for the planned graphs stores that the memory model computes
    inside their readers (:meth:`planner.compiler.PlannerBackend.stores_against_inductor`), per
    phase over the graphs: MiB, count and the largest named. Not all of them are alive at the
    peak; the JSON also has the other direction (values the model stores that no buffer of the
    code holds, by the nodes inductor names as each buffer's origins). Then the step's peak
    predicted with those values counted stored
    (:attr:`planner.compiler.PlannerBackend.compiled_step_peak`), beside the prediction made
    before inductor compiled."""
    lines = []
    for phase in ("forward", "backward"):
        reports = [graph[phase] for graph in row["stores_against_inductor"] if phase in graph]
        errors = [r["error"] for r in reports if "error" in r]
        missed = {name if len(reports) == 1 else f"{k}:{name}": nbytes for k, r in enumerate(reports)
                  for name, nbytes in r.get("unmodelled", {}).items()}
        largest = ", ".join(f"{name} {nbytes / MIB:.1f}" for name, nbytes in sorted(missed.items(), key=lambda kv: -kv[1])[:shown])
        if reports:
            lines.append(f"{phase} {sum(missed.values()) / MIB:.1f} MiB in {len(missed)}" + (f" ({largest})" if largest else "")
                         + (f", {errors[0]}" if errors else ""))
    compiled = row.get("predicted_compiled_peak_bytes")
    told = "" if compiled is None else f"; predicted with them stored {compiled / GIB:.3f} GiB"
    return "  stored by inductor, fused in the memory model: " + "; ".join(lines) + told


def targets(rows: list[dict], slack: float = TIME_SLACK) -> list[str]:
    """The issue's targets for one model's rows, as markdown lines with the deciding figures.

    (a) planner at 1.0: peak <= torch.compile 1.0's, step <= ``slack`` x its time;
    (b) every torch.compile point dominated by a planner point (<= peak, <= ``slack`` x time);
    (c) planner at 0: peak <= the library's checkpointing, step <= 1.3x torch.compile 1.0's;
    (d) predicted peak within 3% of measured at every planner point.
    """
    lines = [f"{r['method']} at {budget_text(r)} failed: {r['error']}" for r in rows if r.get("error")]
    rows = [r for r in rows if not r.get("error")]
    by = {(r["method"], r.get("budget") if r.get("matched") is None else ("matched", r["matched"])): r for r in rows}
    torch_rows = [r for r in rows if r["method"] == "torch.compile"]
    ours = [r for r in rows if r["method"] == "planner"]
    ref, one, zero = by.get(("torch.compile", 1.0)), by.get(("planner", 1.0)), by.get(("planner", 0.0))
    ckpt = by.get(("library checkpointing", None))

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    if ref and one:
        ok = one["peak_activation_bytes"] <= ref["peak_activation_bytes"] and one["step_ms"] <= slack * ref["step_ms"]
        requested = [r.get("peak_requested_bytes") for r in (one, ref)]
        tensors = ("" if None in requested else
                   f"; the tensors' requested peaks {requested[0] / GIB:.4f} against {requested[1] / GIB:.4f} GiB")
        lines.append(f"(a) {verdict(ok)}: planner 1.0 {_gm(one)} against torch.compile 1.0 {_gm(ref)} "
                     f"({one['step_ms'] / ref['step_ms']:.3f}x time{_busy(one, ref)}{tensors})")
    met = 0
    for t in torch_rows:
        best = fastest_within(ours, t)
        met += best is not None and best["step_ms"] <= slack * t["step_ms"]
    measured = ", ".join(budget_text(r) for r in ours) or "none"
    lines.append(f"(b) {verdict(met == len(torch_rows))}: {met} of {len(torch_rows)} torch.compile points dominated "
                 f"by the planner's points measured (budgets {measured})")
    if zero and ckpt and ref:
        ok = zero["peak_activation_bytes"] <= ckpt["peak_activation_bytes"] and zero["step_ms"] <= 1.3 * ref["step_ms"]
        lines.append(f"(c) {verdict(ok)}: planner 0 {_gm(zero)}, library checkpointing {_gm(ckpt)} "
                     f"({zero['step_ms'] / ref['step_ms']:.3f}x torch.compile 1.0's time{_busy(zero, ref)})")
    elif zero and ref:
        ok = zero["step_ms"] <= 1.3 * ref["step_ms"]
        lines.append(f"(c) {verdict(ok)} for the time alone: planner 0 {_gm(zero)} "
                     f"({zero['step_ms'] / ref['step_ms']:.3f}x torch.compile 1.0's time{_busy(zero, ref)}); "
                     "no library checkpointing was measured")
    errors = [(r["predicted_peak_bytes"] - r["peak_activation_bytes"]) / r["peak_activation_bytes"]
              for r in ours if r.get("predicted_peak_bytes") is not None and r["peak_activation_bytes"] > 0]
    if errors:
        worst = max(errors, key=abs)
        compiled = [(r["predicted_compiled_peak_bytes"] - r["peak_activation_bytes"]) / r["peak_activation_bytes"]
                    for r in ours if r.get("predicted_compiled_peak_bytes") is not None and r["peak_activation_bytes"] > 0]
        told = ("" if not compiled else f" (counting what inductor's code stores, known once compiled: "
                f"{min(compiled):+.1%} to {max(compiled):+.1%})")
        lines.append(f"(d) {verdict(abs(worst) <= 0.03)}: predicted peak error {min(errors):+.1%} to {max(errors):+.1%}{told}")
    spread = next((r["spread_ms"] for r in rows if r.get("spread_ms") is not None), None)
    if spread is not None:
        lines.append(f"noise: eager timed first and last differs by {2 * spread:.2f} ms")
    return lines


def _busy(row: dict, ref: dict) -> str:
    """The GPU's busy time of ``row`` against ``ref``'s, its launches (where recorded), and
    whether the host bounds the steps."""
    if row.get("kernel_ms") is None or ref.get("kernel_ms") is None or ref["kernel_ms"] <= 0:
        return ""
    bound = [r for r in (row, ref) if r["host_ms"] >= HOST_BOUND * r["step_ms"]]
    launches = ("" if row.get("launches") is None or ref.get("launches") is None else
                f", {row['launches']:.0f} launches against {ref['launches']:.0f}")
    from bench.gpu_step import differing_kernels

    differ = ""
    if row["kernel_ms"] > ref["kernel_ms"] * TIME_SLACK and (most := differing_kernels(row, ref)):
        differ = "; differing most: " + ", ".join(f"`{name}` {a:.3f} -> {b:.3f} ms" for name, a, b in most)
    return (f"; GPU busy {row['kernel_ms'] / ref['kernel_ms']:.3f}x{launches}" +
            (f", the host's launches {bound[0]['host_ms']:.1f} of {bound[0]['step_ms']:.1f} ms: bound by the host"
             if bound else "") + differ)


def _gm(row: dict) -> str:
    return f"{row['peak_activation_bytes'] / GIB:.3f} GiB / {row['step_ms']:.1f} ms"


def write(rows: list[dict], out: Path, device: str, torch_version: str) -> None:
    save_rows(out.with_suffix(".json"), device, torch_version, rows)
    text = [f"{device}, torch {torch_version}", ""]
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        mixed = ", float32 weights under autocast (bf16)" if any(r.get("autocast") for r in mine) else ""
        text += [f"## {name}: {_description(name)}{mixed}", "", _HEADER, *map(_row, mine), "", *[f"- {t}" for t in targets(mine)], ""]
    out.with_suffix(".md").write_text("\n".join(text))
    print("\n".join(text))


def _model_name(name: str) -> str:
    from bench.zoo_models import spec

    try:
        spec(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return name


def main(argv: list[str] | None = None) -> None:
    from bench.zoo_models import MODELS
    from planner.cli import time_limit_arg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=_model_name, default=["gpt2", "llama", "vit", "resnet50"],
                        help=f"zoo models ({', '.join(sorted(MODELS))}), or timm:ARCH (any timm architecture, "
                             "batch 64) or hf:TYPE (a causal LM of any transformers model type at Llama's size)")
    parser.add_argument("--budgets", type=float, nargs="+", default=BUDGETS)
    parser.add_argument("--torch-budgets", type=float, nargs="+", default=TORCH_BUDGETS)
    parser.add_argument("--time-limit", type=time_limit_arg, default="auto",
                        help="the planner's seconds per solve (default auto, the planner's default)")
    parser.add_argument("--autocast", action="store_true",
                        help="float32 weights, every method's forward inside torch.autocast (bfloat16), as "
                             "mixed-precision training runs; without it the models are bfloat16 throughout")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--matched", action=argparse.BooleanOptionalAction, default=True,
                        help="also plan at each torch.compile point's measured peak as an absolute budget")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="start no model or compiled point after this many seconds of the run; what was measured "
                             "is still timed again and written (leave room for that within a device call's limit)")
    parser.add_argument("--out", type=Path, default=RESULTS / "zoo")
    parser.add_argument("--report", type=Path, nargs="+",
                        help="write the tables of these JSON files instead of measuring (a model measured in "
                             "several keeps the rows of the last file)")
    args = parser.parse_args(argv)
    if args.report:
        try:
            device, version, _ = merge_runs(args.report)  # one device
        except ValueError as err:
            parser.error(str(err))
        by_model: dict[str, list[dict]] = {}
        for path in args.report:  # a later file's rows of a model replace an earlier one's
            runs = merge_runs([path])[2]
            by_model.update({m: [r for r in runs if r["model"] == m] for m in dict.fromkeys(r["model"] for r in runs)})
        write([r for mine in by_model.values() for r in mine], args.out, device, version)
        return
    import torch

    if not torch.cuda.is_available():
        parser.error("this benchmark measures GPU memory and needs CUDA; run it on a GPU machine")
    rows: list[dict] = []
    device, version = torch.cuda.get_device_name(), torch.__version__
    print(f"{device}, torch {version}", flush=True)
    args.deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    from planner._torch_compat import compile_limits_lifted

    # every method compiles the same library frames (a decorator's wrapper that graph breaks
    # resume in) many times in one process: past dynamo's limit of 8 they would run eagerly,
    # so each model starts from empty caches and no method runs into the limit
    with compile_limits_lifted():
        for name in args.models:
            if past_deadline(args):
                print(f"## {name}: skipped, past --max-seconds", flush=True)
                continue
            torch._dynamo.reset()
            run_model(name, args, rows, lambda: save_rows(args.out.with_suffix(".json"), device, version, rows))
    write(rows, args.out, device, version)


if __name__ == "__main__":
    main()
