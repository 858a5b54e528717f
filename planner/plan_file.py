"""Plan files: a solved decision, the graph it was solved for, and its predictions, as JSON.

Schema (``format`` and ``version`` identify it)::

    {"format": "acplanner-plan", "version": 2,
     "fingerprint": "<graph hash>", "settings": {"memory_budget": ..., "solver": ..., "estimator": ...},
     "decision": {...Decision.to_dict()...}, "predicted": {...}}

A file is read and checked whole before anything is applied; writes go to a temporary file
that replaces the target in one step, so a crash never leaves half a file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from planner.cache import write_json
from planner.decision import Decision
from planner.errors import PlanFileError

__all__ = ["PlanFile", "read_plan_file", "write_plan_file", "FORMAT", "VERSION"]

FORMAT, VERSION = "acplanner-plan", 2  # 2: budgets bound peak memory


@dataclass(frozen=True)
class PlanFile:
    fingerprint: str
    settings: dict[str, Any]
    decision: Decision
    predicted: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint, "settings": self.settings,
                "decision": self.decision.to_dict(), "predicted": self.predicted}


def write_plan_file(plan_file: PlanFile, path: str | Path) -> Path:
    """Write atomically (temporary file, then rename)."""
    return write_json(path, plan_file.to_dict())


def read_plan_file(path: str | Path) -> PlanFile:
    """Read and validate a plan file.

    Raises
    ------
    PlanFileError
        If the file cannot be read, is not JSON (e.g. truncated), is of another format or
        version, or lacks a field; the message says which and how to recover.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise PlanFileError(f"cannot read plan file {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise PlanFileError(
            f"plan file {path} is not valid JSON ({err.msg} at line {err.lineno}); it may be truncated: "
            f"delete it to plan again"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PlanFileError(f"{path} is not an acplanner plan file (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise PlanFileError(
            f"plan file {path} has version {data.get('version')!r}; this planner reads version {VERSION}: plan again"
        )
    missing = [k for k in ("fingerprint", "settings", "decision", "predicted") if k not in data]
    if missing:
        raise PlanFileError(f"plan file {path} lacks {', '.join(missing)}; delete it to plan again")
    return PlanFile(str(data["fingerprint"]), dict(data["settings"]), _decision(data["decision"], path), dict(data["predicted"]))


def _decision(data: Any, path: Path) -> Decision:
    names = {f.name for f in fields(Decision)}
    required = names - {"offloaded", "transfers"}  # files from before offloading have neither
    if not isinstance(data, dict) or not required <= set(data) or not isinstance(data.get("saved"), list):
        raise PlanFileError(f"plan file {path} has a malformed decision (expected the fields {', '.join(sorted(required))})")
    offloaded = data.get("offloaded", [])
    if not isinstance(offloaded, list) or not set(offloaded) <= set(data["saved"]):
        raise PlanFileError(f"plan file {path} has a malformed decision: \"offloaded\" must list saved values")
    transfers = data.get("transfers", {})
    if not isinstance(transfers, dict) or not set(transfers) <= set(offloaded) or not all(
            isinstance(t, list) and len(t) == 2 and all(n is None or isinstance(n, str) for n in t)
            for t in transfers.values()):
        raise PlanFileError(f"plan file {path} has a malformed decision: \"transfers\" must give each offloaded value "
                            "[wait_after, reload_before], node names or null")
    try:
        return Decision.from_dict({k: data[k] for k in names if k in data})
    except (TypeError, ValueError) as err:
        raise PlanFileError(f"plan file {path} has a malformed decision: {err}") from None
