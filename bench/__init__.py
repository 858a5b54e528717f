"""Benchmarks, run as ``python -m bench.<name>``; the results file the GPU ones share."""
from __future__ import annotations

import json
from pathlib import Path


def save_rows(path: Path, device: str, torch_version: str, rows: list[dict]) -> None:
    """Write a run's rows as ``{"device", "torch", "rows"}`` JSON (after every point, so a
    cut-off run keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "torch": torch_version, "rows": rows}, indent=1))


def fastest_within(points: list[dict], other: dict) -> dict | None:
    """The fastest of ``points`` (rows with ``peak_activation_bytes`` and ``step_ms``) whose peak
    is no more than ``other``'s, or None: the point that dominates ``other`` if any does."""
    fits = [r for r in points if r["peak_activation_bytes"] <= other["peak_activation_bytes"]]
    return min(fits, key=lambda r: r["step_ms"], default=None)


def merge_runs(paths: list[Path]) -> tuple[str, str, list[dict]]:
    """Device, torch version and all rows of results files written by :func:`save_rows`.

    Raises
    ------
    ValueError
        If the files were measured on different devices, naming them.
    """
    runs = [json.loads(Path(p).read_text()) for p in paths]
    devices = {r["device"] for r in runs}
    if len(devices) > 1:
        raise ValueError(f"the files were measured on different devices ({', '.join(sorted(devices))}); "
                         f"compare one device's runs")
    return runs[0]["device"], runs[0]["torch"], [row for r in runs for row in r["rows"]]
