import pytest
import torch
import torch._dynamo


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, so dynamo's per-code cache limit never kicks in."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
