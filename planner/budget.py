"""Memory budgets: a fraction of the range between the frugal and the fast plan, or a size."""
from __future__ import annotations

from dataclasses import dataclass

from planner.bounds import fast_end_plan
from planner.errors import ConfigError
from planner.problem import Problem
from planner.units import format_bytes, parse_size

__all__ = ["Budget"]


@dataclass(frozen=True)
class Budget:
    """A budget on peak activation memory over the training step.

    Exactly one of ``fraction`` (in [0, 1]: 0 is the peak of the most memory-frugal plan, 1 the
    peak of the fast end, :func:`~planner.bounds.fast_end_plan`, or of PyTorch's own split of the
    graph where that is lower (``PlannerConfig.fast_end``), linear in bytes between them) and
    ``nbytes`` (an absolute bound on the peak) is set.
    """

    fraction: float | None = None
    nbytes: int | None = None

    @classmethod
    def parse(cls, value: "Budget | float | int | str") -> "Budget":
        """Read a budget: a float fraction, an int of bytes, or a string such as ``"1.5GiB"``.

        Raises
        ------
        ConfigError
            For a fraction outside [0, 1], a negative size, or unreadable text.
        """
        if isinstance(value, Budget):
            return value
        if isinstance(value, bool):
            raise ConfigError(_HELP.format(value=value))
        if isinstance(value, float):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(_HELP.format(value=value))
            return cls(fraction=value)
        if isinstance(value, int):
            if value < 0:
                raise ConfigError(_HELP.format(value=value))
            if value in (0, 1):  # a fraction's end without its ".0" (TOML and YAML read `memory_budget = 1` so)
                end = "the most memory-frugal plan" if value == 0 else "the fast end"
                raise ConfigError(f"memory_budget={value} is a whole number, read as a size of {value} byte"
                                  f"{'s' if value == 0 else ''}, which no training step fits; for the fraction ({end}) "
                                  f"write {value}.0")
            return cls(nbytes=value)
        if isinstance(value, str):
            text = value.strip()
            if "." in text and text.replace(".", "", 1).isdigit():
                return cls.parse(float(text))  # "0.5" in a config file is a fraction
            if text.isdecimal():
                return cls.parse(int(text))  # "4096" is bytes, as the int is
            try:
                return cls(nbytes=parse_size(text))
            except ValueError as err:
                raise ConfigError(f"memory_budget: {err}") from None
        raise ConfigError(_HELP.format(value=repr(value)))

    def resolve(self, problem: Problem, least_peak: int | None = None, pytorch_peak: int | None = None) -> int:
        """The peak budget in bytes for this problem. A fraction is of the range from
        ``least_peak`` (by default the frugal reference's peak, :mod:`solvers.reference`: found
        in a fraction of a second, the same on every run) to the fast end's peak
        (:func:`~planner.bounds.fast_end_plan`), or to ``pytorch_peak`` where that is lower (the
        peak of PyTorch's own split of the graph, ``PlannerConfig.fast_end``), but not below
        ``least_peak``. Where the fast end's own peak is below ``least_peak``, every fraction
        resolves to it. 1.0 is the lower of the two ends' peaks, which no frugal plan is needed
        to bound (finding the frugal reference of a large graph takes seconds)."""
        if self.nbytes is not None:
            return self.nbytes
        hi = fast_end_plan(problem).peak_bytes
        if self.fraction == 1.0:  # the peak of a plan (the fast end's or PyTorch's split), met by that plan
            return hi if pytorch_peak is None else min(hi, pytorch_peak)
        if least_peak is None:
            from solvers.reference import reference_plan  # solvers build on planner, not the reverse
            least_peak = reference_plan(problem).peak_bytes
        least_peak = min(least_peak, hi)  # the fast end's plan is known: the range starts no higher
        if pytorch_peak is not None:
            hi = max(min(hi, pytorch_peak), least_peak)
        return least_peak + int((hi - least_peak) * self.fraction)

    def __str__(self) -> str:
        return f"{self.fraction:g}" if self.fraction is not None else format_bytes(self.nbytes)


_HELP = (
    "memory_budget={value} is out of range; give a fraction in [0.0, 1.0] (0.0 = most memory-frugal "
    "plan, 1.0 = the fast end: the fastest plan, holding no more than PyTorch's own split), a size such "
    "as '1.5GiB', or a non-negative int of bytes"
)
