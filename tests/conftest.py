import os
import tempfile

import pytest
import torch
import torch._dynamo
from hypothesis import settings

# Property tests draw the same examples on every run and machine (no example database): the
# suite is deterministic, and an example one machine once failed on is not replayed there alone.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")

# The profile estimator's disk cache: a fresh one per run, never the user's.
os.environ["ACPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="acplan-cache-")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, so dynamo's per-code cache limit never kicks in."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
