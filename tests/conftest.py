import os
import tempfile

import pytest
import torch
import torch._dynamo

# The profile estimator's disk cache: a fresh one per run, never the user's.
os.environ["ACPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="acplan-cache-")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, so dynamo's per-code cache limit never kicks in."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
