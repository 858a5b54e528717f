"""Planner configuration: one validated dataclass, read once at the API edge."""
from __future__ import annotations

import tomllib
from difflib import get_close_matches
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from planner.budget import Budget
from planner.tracing import CODEGENS
from planner.errors import ConfigError

__all__ = ["PlannerConfig", "FRUGAL_SEARCHES", "FAST_ENDS", "AUTO_TIME_LIMIT", "AUTO_PARTITION_MULTIPLE",
           "AUTO_FAST_END_MULTIPLE"]

FRUGAL_SEARCHES = ("auto", "exact", "reference")
FAST_ENDS = ("pytorch", "model")
OFFLOADS = ("off", "auto")
# time_limit="auto": seconds per node of the graph's problem, and the least and most seconds.
# PyTorch's own partition takes 0.5-1.6 ms per node on a 2-core CPU (built-in GPT, 12 and 48
# layers, budgets 0.1-0.8); in this time CP-SAT's plans there came within 1% of the best known
# (docs/solvers-cold-exact.md).
AUTO_TIME_LIMIT = (0.01, 5.0, 60.0)
# ... and where PyTorch's own split of the graph was made for the fast end (a fraction budget with
# fast_end "pytorch"), no more than this many times the seconds that split took, within the same
# range: the limit then follows the machine's speed, as the solvers' progress does, and planning
# costs a bounded multiple of what torch.compile spends partitioning the graph. On the built-in
# GPT at 48 layers and budget 0.1 (2-core CPU, a slow run of it: PyTorch's partition 8.3 s), CP-SAT
# came within 0.00% of the best plan known in 40.6 s and 2.38% off it under 6x the split's time.
AUTO_PARTITION_MULTIPLE = 10.0
# ... and at budget 1.0 this many: there the solver's plan replaces PyTorch's split only where it
# holds clearly less (planner.torch_split.prefer_pytorch_split), and otherwise the split is what
# runs. On timm's RexNet-100 and ConvFormer-S18 (batch 64, bf16, H100 prices, 2-core CPU) a 5 s
# limit gave the solver the plans, of the same bytes and seconds, that 32.3 s and 12.3 s gave it,
# and the split was taken each time; their plans at 1.0 took 45 s and 11-20 s.
AUTO_FAST_END_MULTIPLE = 2.0


@dataclass(frozen=True)
class PlannerConfig:
    """Everything that decides a plan.

    Attributes
    ----------
    memory_budget : fraction in [0, 1] (0 = most memory-frugal plan, 1 = the fast end, see
        ``fast_end``),
        a size such as ``"1.5GiB"``, or an int of bytes, for activations kept for the backward.
    solver : name of a registered solver (see ``solvers.available_solvers()``).
    estimator : name of a registered estimator (see ``estimators.available_estimators()``); the
        default ``auto`` prices graphs on CUDA with ``roofline`` and others with ``flops``.
    time_limit : seconds a solver may spend on one graph, or ``"auto"`` (the default): 10 ms per
        node of the graph's problem (its forward nodes), and where PyTorch's own split of the
        graph was made for a fraction budget, no more than 10 times the seconds that took; at
        least 5 s and at most 60 s (:meth:`solver_seconds`; ``Decision.stats["time_limit"]``
        says which applied). It bounds each search on the graph: where the exact least-peak
        search runs first (``frugal_search``), it has the same limit, so the two can take twice it;
        that search's limit is counted in work done rather than wall seconds (about wall seconds
        on a 2-core CPU, at most three times them on a slower machine), so budget 0 resolves to
        the same plan under any load (:mod:`solvers.clock`).
    codegen : ``"inductor"`` (compiled kernels) or ``"eager"`` (op by op, for debugging).
    solver_options, estimator_options : extra keyword arguments for the solver / estimator.
    inductor_options : inductor config settings for planned graphs, over the planner's own
        (``allow_buffer_reuse`` and ``reorder_for_peak_memory`` off: see
        :func:`planner._torch_compat.inductor_compile`); ``codegen="inductor"`` only. Where
        budget 1.0 takes PyTorch's split, the graph is compiled with inductor's own settings
        (as ``torch.compile`` compiles it), and these apply over those. At budget 0 the planner
        also turns off inductor's padding of matrix products (:meth:`inductor_settings`).
    frugal_search : where budget 0 lies. ``"auto"``: the frugal reference (a local search, fast
        and deterministic), except that an exact solver at budget 0, or given an absolute budget
        below the reference's peak, runs the exact least-peak search (CP-SAT, up to
        ``time_limit``); ``"exact"``: fractions are of the range from the exact least peak
        too; ``"reference"``: the exact search never runs.
    fast_end : where budget 1.0 lies. ``"pytorch"``: the planner's fast end
        (:func:`planner.bounds.fast_end_plan`), or where PyTorch's own split of the graph (what
        ``torch.compile`` saves at its default ``activation_memory_budget``) has a lower peak by
        the planner's memory model, that peak: the solver then finds the fastest plan holding no
        more than PyTorch would, and at budget 1.0 itself the plan is PyTorch's split unless the
        solver's holds more than 3% less, the two plans' modules simulated, and is not
        estimated slower (:func:`planner.torch_split.prefer_pytorch_split`: the estimates cannot
        tell plans closer than that apart, and 1.0 buys no memory with time;
        ``Decision.stats["fast_end_choice"]``
        says when the split was taken). A split so taken is PyTorch's partitioner's own forward
        and backward, compiled as ``torch.compile`` compiles them
        (:func:`planner.torch_split.compiles_as_pytorch`), so budget 1.0's step is torch.compile's
        wherever the split is taken. ``"model"``: the planner's fast end alone.
    offload : ``"off"`` (default): saved values stay in device memory. ``"auto"``: on a CUDA
        device, saved values may also be offloaded to host memory (:mod:`planner.offload`).
        The exact solvers (``cpsat``, ``ilp``) choose per value whether to save, recompute or
        offload it, the link's time a resource of the program (:mod:`solvers.offload`), and
        an absolute budget may then lie below the least peak without offloading. The other
        solvers do not weigh offloading: the plan of the budget is compared with the plan of
        the fast end whose greedy offloads bring its peak under the budget, and the one of
        fewer estimated seconds is kept, offloaded where the link hides the copies and the peak
        falls. On a CPU nothing is offloaded (``Decision.stats["offload"]`` says so, and which
        method chose).
    offload_bandwidth : bytes per second of one direction of the host link; ``None`` measures
        pinned copies on the device once per process.
    offload_min_bytes : the smallest value worth offloading (default 1 MiB).
    offload_op_seconds : seconds one offloaded value adds to the step beside its copies (the
        host's work on its transfer ops), which the exact solvers weigh (default 20e-6).
    offload_host_bytes : the most host memory the step's offloaded values may hold (an int of
        bytes or a size such as ``"32GiB"``); ``None`` (default): no bound. Every offloaded
        value is in host memory at the end of the forward (its copy to host is done by then,
        its copy back not begun), so this bounds the sum of their bytes.
    replan : plan a compiled graph again once a training step has run, for what the step showed
        (the times the graph ran before its backward; what the graphs after it needed while its
        saved values waited; at budget 0, the saves the polish dropped where inductor's code was
        found to hold more than the plan), compiling it again where the plan changes
        (:class:`planner.compiler.PlannerBackend`). ``False`` keeps the plans made at compile time.
    """

    memory_budget: float | int | str = 1.0
    solver: str = "cpsat"
    estimator: str = "auto"
    time_limit: float | str = "auto"
    codegen: str = "inductor"
    solver_options: dict[str, Any] = field(default_factory=dict)
    estimator_options: dict[str, Any] = field(default_factory=dict)
    inductor_options: dict[str, Any] = field(default_factory=dict)
    frugal_search: str = "auto"
    fast_end: str = "pytorch"
    replan: bool = True
    offload: str = "off"
    offload_bandwidth: float | None = None
    offload_min_bytes: int = 1 << 20
    offload_op_seconds: float = 20e-6
    offload_host_bytes: int | str | None = None

    def inductor_settings(self) -> dict[str, Any]:
        """The inductor settings planned graphs are captured and compiled with: ``inductor_options``
        over the planner's own for this budget. Budget 0 asks for the least memory, so there
        inductor pads no matrix products (:func:`planner._torch_compat.no_matmul_padding`): it
        decides each pad by timing the product on the device while compiling, so the graph, and
        with it the least peak, changed from run to run (on an H100, timm's Swin at budget 0 was
        planned at 0.737, 0.801 and 0.940 GiB in three runs; without pads, 0.737 GiB, measured
        0.744 against 0.796 padded, at 1.06x the padded step's time)."""
        from planner._torch_compat import no_matmul_padding

        own = no_matmul_padding() if self.memory_budget.fraction == 0.0 else {}
        return {**own, **self.inductor_options}

    def __post_init__(self) -> None:
        from estimators import available_estimators
        from solvers import available_solvers

        object.__setattr__(self, "memory_budget", Budget.parse(self.memory_budget))
        _check_choice("solver", self.solver, available_solvers())
        _check_choice("estimator", self.estimator, available_estimators())
        _check_choice("codegen", self.codegen, list(CODEGENS))
        _check_choice("frugal_search", self.frugal_search, list(FRUGAL_SEARCHES))
        _check_choice("fast_end", self.fast_end, list(FAST_ENDS))
        _check_choice("offload", self.offload, list(OFFLOADS))
        if self.offload_bandwidth is not None and (isinstance(self.offload_bandwidth, bool)
                                                   or not isinstance(self.offload_bandwidth, (int, float))
                                                   or not self.offload_bandwidth > 0):
            raise ConfigError(f"offload_bandwidth={self.offload_bandwidth!r} is invalid; give a positive number of "
                              "bytes per second, or leave it unset to measure the link")
        if isinstance(self.offload_min_bytes, bool) or not isinstance(self.offload_min_bytes, int) \
                or self.offload_min_bytes < 0:
            raise ConfigError(f"offload_min_bytes={self.offload_min_bytes!r} is invalid; give a non-negative int of bytes")
        if isinstance(self.offload_op_seconds, bool) or not isinstance(self.offload_op_seconds, (int, float)) \
                or not self.offload_op_seconds >= 0:
            raise ConfigError(f"offload_op_seconds={self.offload_op_seconds!r} is invalid; give a non-negative number "
                              "of seconds")
        object.__setattr__(self, "offload_host_bytes", _host_bytes(self.offload_host_bytes))
        if self.time_limit != "auto" and (isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float))
                                          or not self.time_limit > 0):
            raise ConfigError(f"time_limit={self.time_limit!r} is invalid; give a positive number of seconds or \"auto\"")
        if not isinstance(self.replan, bool):
            raise ConfigError(f"replan={self.replan!r} is invalid; give true or false")
        for name in ("solver_options", "estimator_options", "inductor_options"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a table/mapping of keyword arguments, got {getattr(self, name)!r}")

    @property
    def budget(self) -> Budget:
        return self.memory_budget  # parsed in __post_init__

    def solver_seconds(self, problem_nodes: int, partition_seconds: float | None = None) -> float:
        """The time limit for one graph whose problem has ``problem_nodes`` nodes: ``time_limit``,
        or for ``"auto"`` :data:`AUTO_TIME_LIMIT`'s seconds per node, no more than
        :data:`AUTO_PARTITION_MULTIPLE` (at budget 1.0 :data:`AUTO_FAST_END_MULTIPLE`) times
        ``partition_seconds`` (PyTorch's own partition of the graph, where it was timed), clipped
        to the range."""
        return self.solver_time_limit(problem_nodes, partition_seconds)[0]

    def solver_time_limit(self, problem_nodes: int, partition_seconds: float | None = None) -> tuple[float, str]:
        """:meth:`solver_seconds`, and the rule that set it in words (``Decision.stats["time_limit"]``)."""
        if self.time_limit != "auto":
            return float(self.time_limit), "time_limit as configured"
        per_node, least, most = AUTO_TIME_LIMIT
        seconds, rule = per_node * problem_nodes, f"auto: {per_node * 1e3:g} ms per node of the problem ({problem_nodes})"
        multiple = AUTO_FAST_END_MULTIPLE if self.budget.fraction == 1.0 else AUTO_PARTITION_MULTIPLE
        if partition_seconds is not None and multiple * partition_seconds < seconds:
            seconds = multiple * partition_seconds
            rule = f"auto: {multiple:g}x PyTorch's partition of the graph ({partition_seconds:.3g} s)"
        if not least <= seconds <= most:
            seconds, rule = min(most, max(least, seconds)), f"{rule}, clipped to {least:g}-{most:g} s"
        return seconds, rule

    def replace(self, **changes: Any) -> "PlannerConfig":
        """A copy with some fields changed (validated again); an unknown name is an error naming
        the nearest field and the allowed ones."""
        _known_fields(type(self), changes, "settings")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def with_compile_arguments(self, mode: str | None = None, options: Any = None) -> "PlannerConfig":
        """This config with the arguments ``torch.compile`` hands the backend it is given (by name
        or as an object): ``options``, planner settings by field name, over this config's (as
        inductor reads its own settings from them); ``mode``, one of inductor's modes
        (``"max-autotune-no-cudagraphs"``...), as the inductor settings it stands for, under
        ``inductor_options`` (where those set the same setting, theirs stands).

        Raises
        ------
        ConfigError
            For options that are not a mapping of settings or name no setting (inductor's own
            go under ``inductor_options``), an unknown mode, or a mode that runs the step as CUDA
            graphs (``"reduce-overhead"``, ``"max-autotune"``): their memory pools are outside the
            planner's peak, and planned steps have not been measured under them.
        """
        from planner._torch_compat import inductor_modes

        config = self
        if options is not None:
            if not isinstance(options, dict):
                raise ConfigError(f"torch.compile(options={options!r}): give a dict of planner settings, "
                                  "e.g. options={'memory_budget': 0.5}")
            try:
                _known_fields(type(self), options, "torch.compile(options=...)")
            except ConfigError as err:
                raise ConfigError(f"{err} (options name planner settings; inductor's go under inductor_options)") from None
            config = config.replace(**options)
        if mode is not None and mode != "default":
            modes = inductor_modes()
            if mode not in modes:
                raise ConfigError(f"torch.compile(mode={mode!r}): no such mode; inductor's are {', '.join(modes)}")
            settings = modes[mode]
            if settings.get("triton.cudagraphs"):
                plain = [m for m, s in modes.items() if not s.get("triton.cudagraphs") and m != "default"]
                raise ConfigError(
                    f"torch.compile(mode={mode!r}) runs the step as CUDA graphs, whose memory pools the planner's "
                    f"peak does not count and with which planned steps have not been measured; use a mode without "
                    f"them ({', '.join(plain)}), or ask for them as inductor_options={{'triton.cudagraphs': True}}")
            config = replace(config, inductor_options={**settings, **config.inductor_options})
        return config

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "PlannerConfig":
        """Build from a mapping; unknown keys are an error naming the allowed ones."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a table of planner settings, got {type(data).__name__}")
        _known_fields(cls, data, source)
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path) -> "PlannerConfig":
        """Read a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file.

        Settings sit at the top level or under a ``[planner]`` table.

        Raises
        ------
        ConfigError
            If the file is missing, is not valid TOML/YAML, or holds an invalid field.
        """
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
        suffix = path.suffix.lower()
        if suffix not in (".toml", ".yaml", ".yml"):
            raise ConfigError(f"config file {path} must end in .toml, .yaml or .yml")
        try:
            if suffix == ".toml":
                data = tomllib.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text) or {}
        except (tomllib.TOMLDecodeError, ValueError) as err:
            raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {err}") from None
        except Exception as err:  # yaml.YAMLError, without importing yaml for TOML users
            if type(err).__module__.startswith("yaml"):
                raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
            raise
        if isinstance(data, dict) and set(data) == {"planner"}:
            data = data["planner"]
        return cls.from_dict(data, source=str(path))


def _check_choice(name: str, value: Any, allowed: list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _host_bytes(value: Any) -> int | None:
    """``offload_host_bytes`` as bytes (None: no bound), from an int or a size such as ``"32GiB"``."""
    from planner.units import parse_size

    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as err:
            raise ConfigError(f"offload_host_bytes={value!r} is invalid: {err}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"offload_host_bytes={value!r} is invalid; give a non-negative int of bytes, a size such "
                          "as '32GiB', or leave it unset for no bound")
    return value


def _known_fields(cls: type, names, source: str) -> None:
    """Raise a ConfigError where ``names`` holds a name that is not a field of ``cls``, naming the
    nearest field where one is close and every allowed field."""
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        near = [f"{name} (did you mean {close[0]}?)" if (close := get_close_matches(name, allowed, n=1)) else name
                for name in unknown]
        raise ConfigError(f"{source}: unknown field(s) {', '.join(near)}; allowed fields: {', '.join(allowed)}")
