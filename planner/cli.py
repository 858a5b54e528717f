"""``acplan``: plan a model, compare solvers, or check that a planned model trains like eager.

    acplan plan planner.models:gpt_example --budget 0.5 --solver ilp --out plan.json
    acplan compare planner.models:gpt_example --budgets 1 0.5 0.2 --solvers ilp dp greedy --out-dir out/
    acplan check planner.models:gpt_example --budgets 1 0 --dtype float64

MODULE:FACTORY names a function taking no arguments and returning ``(model, example_inputs)``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Callable

from planner.errors import PlannerError

__all__ = ["main"]


def load_factory(spec: str) -> Callable[[], Any]:
    """Import ``module:function``; errors say what to write instead."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise PlannerError(f"{spec!r} is not MODULE:FACTORY (for example planner.models:gpt_example)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise PlannerError(f"cannot import module {module_name!r}: {err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise PlannerError(f"module {module_name!r} has no function {attr!r}")
    return factory


def _model_and_inputs(spec: str):
    made = load_factory(spec)()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise PlannerError(f"{spec} must return (model, example_inputs), got {type(made).__name__}")
    return made


def time_limit_arg(text: str) -> float | str:
    """``--time-limit``: a number of seconds, or ``auto``."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds or auto") from None


def _config(args: argparse.Namespace):
    from planner.config import PlannerConfig

    config = PlannerConfig.from_file(args.config) if args.config else PlannerConfig(codegen="eager")
    return config.replace(time_limit=args.time_limit)


def cmd_plan(args: argparse.Namespace) -> int:
    from planner.api import plan

    model, inputs = _model_and_inputs(args.factory)
    budget = _budget(args.budget) if args.budget is not None else None
    result = plan(model, inputs, memory_budget=budget, solver=args.solver, estimator=args.estimator, config=_config(args))
    print(result.summary())
    if args.out:
        print(f"wrote {result.save(args.out)}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from planner.comparison import plot_pareto, sweep, to_markdown

    model, inputs = _model_and_inputs(args.factory)
    records = sweep(model, inputs, [_budget(b) for b in args.budgets], args.solvers, args.estimators, config=_config(args))
    table = to_markdown(records)
    print(table)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table + "\n")
    print(f"wrote {out / 'compare.md'} and {plot_pareto(records, out / 'pareto.png')}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import torch

    import planner
    from planner.check import allowance_note, check_model

    config = _config(args).replace(codegen=args.codegen)
    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    rows = check_model(_model_and_inputs(args.factory), [_budget(b) for b in args.budgets],
                       lambda model, budget: planner.compile(model, memory_budget=budget, config=config),
                       dtype=dtype, tolerance=args.tolerance, torch_compile=args.codegen == "inductor",
                       autocast=None if args.autocast is None else getattr(torch, args.autocast))
    beside = any(row.get("from_torch_compile") is not None for row in rows)
    print("| run | largest relative difference from eager | in | passed |" + (" from torch.compile's step |" if beside else ""))
    print("|---|---|---|---|" + ("---|" if beside else ""))
    for row in rows:
        verdict = "-" if row["passed"] is None else ("yes" if row["passed"] else f"NO (allowed {row['allowed']:.1e})")
        other = row.get("from_torch_compile")
        extra = (" - |" if other is None else f" {other:.1e} |") if beside else ""
        print(f"| {row['run']} | {row['relative']:.1e} | {row['where']} | {verdict} |{extra}")
    failed = [row["run"] for row in rows if row["passed"] is False]
    print(f"\n{'every planned step trains like eager' if not failed else 'DIFFERS from eager: ' + ', '.join(failed)}")
    note = allowance_note(rows)
    if note is not None:
        print(note)
    return 1 if failed else 0


def _budget(text: str) -> float | str:
    """Command-line budgets: a plain number is a fraction, anything else a size (``2GiB``)."""
    try:
        return float(text)
    except ValueError:
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="acplan", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("factory", help="MODULE:FACTORY returning (model, example_inputs)")
        p.add_argument("--config", type=Path, help="TOML or YAML settings; flags override them")
        p.add_argument("--time-limit", type=time_limit_arg, default=None,
                       help="seconds per solve, or auto (default: 10 ms per node of the graph's problem, 5-60 s)")

    p = sub.add_parser("plan", help="plan one model, print the summary, optionally write the plan file")
    common(p)
    p.add_argument("--budget", help="fraction in [0, 1] or a size such as 2GiB (default: the config's)")
    p.add_argument("--solver", help="solver name (see --help of `compare` for the list)")
    p.add_argument("--estimator", help="runtime estimator name")
    p.add_argument("--out", type=Path, help="write the plan file here (JSON)")
    p.set_defaults(run=cmd_plan)

    from estimators import available_estimators
    from solvers import available_solvers

    c = sub.add_parser("compare", help="sweep budgets x solvers x estimators; write a table and a Pareto PNG")
    common(c)
    c.add_argument("--budgets", nargs="+", default=["1.0", "0.5", "0.2", "0.0"], help="budgets (default 1 0.5 0.2 0)")
    c.add_argument("--solvers", nargs="+", default=available_solvers(), choices=available_solvers(), metavar="SOLVER",
                   help=f"solvers (default all: {', '.join(available_solvers())})")
    c.add_argument("--estimators", nargs="+", default=["auto"], choices=available_estimators(), metavar="ESTIMATOR",
                   help=f"estimators (default flops; available: {', '.join(available_estimators())})")
    c.add_argument("--out-dir", default="acplan-out", help="where compare.md and pareto.png go (default acplan-out)")
    c.set_defaults(run=cmd_compare)

    k = sub.add_parser("check", help="train one step eager, under torch.compile and planned at each budget; compare")
    common(k)
    k.add_argument("--budgets", nargs="+", default=["1.0", "0.0"], help="budgets (default 1 0)")
    k.add_argument("--codegen", choices=("inductor", "eager"), default="inductor",
                   help="how planned graphs run (default inductor, as torch.compile; eager skips torch.compile's run)")
    k.add_argument("--dtype", choices=("float64", "float32", "bfloat16", "float16"), default=None,
                   help="cast the model and its floating inputs first (default: as the factory made them)")
    k.add_argument("--autocast", choices=("bfloat16", "float16"), default=None,
                   help="run each forward inside torch.autocast to this type, as mixed-precision training does")
    k.add_argument("--tolerance", type=float, default=1e-5,
                   help="a relative difference always allowed (default 1e-5); beyond it, up to 10x torch.compile's")
    k.set_defaults(run=cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except PlannerError as err:
        print(f"acplan: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
