"""Byte sizes: parsing ``"1.5GiB"`` and printing sizes for people."""
from __future__ import annotations

import re

__all__ = ["parse_size", "format_bytes"]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a size such as ``"12GiB"``, ``"500 MB"`` or ``"4096"`` into bytes.

    Raises
    ------
    ValueError
        If the text is not a number followed by one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a size; write a number and a unit such as '1.5GiB', "
            f"'800MiB' or '2GB' (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    return int(round(float(match.group(1)) * _UNITS[unit]))


def format_bytes(n: float) -> str:
    """Human-readable size with binary units, e.g. ``1.50 GiB``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"
