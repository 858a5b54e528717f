"""How planned graphs are compiled, against PyTorch's: each difference toggled on its own.

Per zoo model at budget 1.0 (the planner's at ``--budget``), in one process on one GPU (bf16),
timed interleaved at the end as ``bench/zoo.py`` does:

- ``torch.compile``: stock, PyTorch's partitioner and inductor's own settings;
- ``torch split, planner settings``: PyTorch's partitioner compiled through the planner's path
  (its inductor settings: no buffer pool, no reordering for peak memory), which tells the
  settings' share of a gap from the split's;
- ``planner``: the planner at its defaults, then with each inductor setting of
  ``--options`` set as inductor's default has it (``allow_buffer_reuse=True`` ...).

With ``--kernels``, one profiled step of stock torch.compile and of the planner: GPU time and
kernel count per kernel family (matrix products, convolutions, inductor's pointwise, reduction
and persistent-reduction kernels, copies), so a step-time gap can be read off where it lies, and
the kernels whose GPU time differs most between the two, by name (launch arguments and inductor's
numeric suffixes dropped, so the same kernel in both steps shares a name).

    python -m bench.compile_variants [--models resnet50 gpt2] [--kernels]
"""
from __future__ import annotations

import argparse
import copy
from collections import defaultdict
from pathlib import Path

from bench import save_rows

RESULTS = Path(__file__).parent / "results"
GIB = 2**30
OPTIONS = ["allow_buffer_reuse=True", "reorder_for_peak_memory=True"]


def _parse(option: str) -> tuple[str, object]:
    key, _, value = option.partition("=")
    if value.lstrip("-").isdigit():
        return key, int(value)
    return key, {"True": True, "False": False, "None": None}.get(value, value)


def variants(args) -> list[tuple[str, object]]:
    """``(label, make)`` pairs; ``make(model)`` returns the compiled model."""
    import torch

    import planner
    from planner import _torch_compat
    from planner.tracing import make_backend

    def torch_split(model):
        split = make_backend(_torch_compat.pytorch_partition(), "inductor")
        return torch.compile(planner.own_frame(model), backend=split)

    def planned(**options):
        return lambda model: planner.compile(model, memory_budget=args.budget, time_limit=args.time_limit,
                                             inductor_options=options)

    found = [("torch.compile", lambda model: torch.compile(planner.own_frame(model))),
             ("torch split, planner settings", torch_split), ("planner", planned())]
    return found + [(f"planner, {option}", planned(**dict([_parse(option)]))) for option in args.options]


def kernel_families(run, params, batch) -> tuple[dict[str, tuple[float, int]], dict[str, tuple[float, int]]]:
    """GPU milliseconds and kernel count per kernel family, and per kernel name
    (:func:`bench.gpu_step.kernel_times`), in one profiled step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.gpu_step import kernel_times

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(*batch).backward()
        torch.cuda.synchronize()
    for p in params:
        p.grad = None
    families: dict[str, list] = defaultdict(lambda: [0.0, 0])
    work = [event for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    for event in work:
        family = families[_family(event.name)]
        family[0] += event.device_time_total / 1e3
        family[1] += 1
    return {k: (round(v[0], 3), v[1]) for k, v in families.items()}, kernel_times(work)


def _family(name: str) -> str:
    lower = name.lower()
    if lower.startswith("triton_"):
        return "inductor " + {"poi": "pointwise", "red": "reduction", "per": "persistent reduction",
                              "tem": "template"}.get(lower.split("_")[1], lower.split("_")[1])
    for key, family in (("conv", "convolution"), ("dgrad", "convolution"), ("wgrad", "convolution"),
                        ("gemm", "matrix product"), ("nvjet", "matrix product"), ("cutlass", "matrix product"),
                        ("flash", "attention"), ("fmha", "attention"), ("memcpy", "copy"), ("memset", "copy"),
                        ("elementwise", "aten pointwise"), ("reduce", "aten reduction")):
        if key in lower:
            return family
    return "other: " + name[:40]


def run_model(name: str, args, rows: list[dict], save) -> None:
    import torch

    from bench.gpu_step import again_together, measure
    from bench.zoo_models import build

    base, batch = build(name, "bench", device="cuda", dtype=torch.bfloat16)
    kept, mine = [], []
    for label, make in variants(args):
        model = copy.deepcopy(base)
        run, params = make(model), list(model.parameters())
        row = {"model": name, "variant": label, **measure(run, params, batch, args.steps)}
        if args.kernels and label in ("torch.compile", "planner"):
            row["kernels"], row["kernel_names"] = kernel_families(run, params, batch)
        kept.append((run, params))
        mine.append(row)
        rows.append(row)
        save()
        print(f"| {name} | {label} | {row['peak_activation_bytes'] / GIB:.3f} | {row['step_ms']:.2f} |", flush=True)
    again_together(mine, kept, batch, args.rounds, args.steps)
    save()
    del base, kept
    torch.cuda.empty_cache()


def report(rows: list[dict]) -> list[str]:
    lines = ["| model | variant | peak activation GiB | step ms (interleaved) | step ms (alone) |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['variant']} | {r['peak_activation_bytes'] / GIB:.3f} | {r['step_ms']:.2f} "
              f"| {r['step_ms_alone']:.2f} |" for r in rows]
    for model in dict.fromkeys(r["model"] for r in rows):
        profiled = [r for r in rows if r["model"] == model and "kernels" in r]
        if len(profiled) < 2:
            continue
        families = sorted({f for r in profiled for f in r["kernels"]})
        lines += ["", f"{model}: GPU ms / kernels per family in one step",
                  "| family | " + " | ".join(r["variant"] for r in profiled) + " |", "|---" * (len(profiled) + 1) + "|"]
        for family in sorted(families, key=lambda f: -max(r["kernels"].get(f, (0, 0))[0] for r in profiled)):
            cells = [r["kernels"].get(family, (0.0, 0)) for r in profiled]
            lines.append(f"| {family} | " + " | ".join(f"{ms:.3f} / {n}" for ms, n in cells) + " |")
        lines += _differing_kernels(model, profiled)
    return lines


def _differing_kernels(model: str, profiled: list[dict], most: int = 15) -> list[str]:
    """The kernel names whose GPU time differs most between the first two profiled variants."""
    from bench.gpu_step import differing_kernels

    if not all("kernel_names" in r for r in profiled[:2]):
        return []
    first, second = profiled[:2]
    lines = ["", f"{model}: kernels whose GPU time differs most (ms / launches)",
             f"| kernel | {first['variant']} | {second['variant']} |", "|---|---|---|"]
    for name, a, b in differing_kernels(second, first, most):
        n, m = (r["kernel_names"].get(name, (0.0, 0))[1] for r in (first, second))
        lines.append(f"| `{name}` | {a:.3f} / {n:.0f} | {b:.3f} / {m:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    from bench.zoo_models import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["resnet50", "llama"])
    parser.add_argument("--options", nargs="*", default=OPTIONS, help="inductor settings to try one at a time")
    parser.add_argument("--budget", type=float, default=1.0, help="the planner's budget (torch.compile's stays 1.0)")
    parser.add_argument("--kernels", action="store_true", help="profile one step of torch.compile and the planner")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "compile_variants")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        parser.error("this benchmark measures GPU memory and needs CUDA; run it on a GPU machine")
    rows: list[dict] = []
    device, version = torch.cuda.get_device_name(), torch.__version__
    out = args.out.with_suffix(".json")
    for name in args.models:
        run_model(name, args, rows, lambda: save_rows(out, device, version, rows))
    text = [f"{device}, torch {version}", "", *report(rows)]
    args.out.with_suffix(".md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
