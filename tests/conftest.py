"""Fixtures shared by several test files (helpers that are plain functions live in modules such
as train_data.py)."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models: thousands of tiny ops, which two threads on a busy machine only slow down.
    A test file uses it for all its tests with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
