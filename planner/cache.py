"""Where the planner keeps what it measured or searched for, and how it writes files there.

Profiled op times (:mod:`estimators.profile`) and most frugal plans (:mod:`solvers.frugal`)
live in :func:`default_cache_dir`; deleting a file there only makes the next run measure or
search again.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["default_cache_dir", "write_json"]


def default_cache_dir() -> Path:
    """``$ACPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/acplanner``, else ``~/.cache/acplanner``."""
    if os.environ.get("ACPLAN_CACHE_DIR"):
        return Path(os.environ["ACPLAN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "acplanner"


def write_json(path: str | Path, data: Any, indent: int = 1) -> Path:
    """Write ``data`` as JSON atomically: a temporary file beside ``path``, then a rename, so a
    reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
