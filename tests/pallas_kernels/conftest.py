"""Shared fixtures of the pallas_kernels tests.

Tests marked `gpu` compile kernels for a GPU; tests/conftest.py skips them
(with the reason) where there is none, so the whole suite runs everywhere.
"""

from __future__ import annotations

import pytest

from pallas_kernels._src import guard


@pytest.fixture
def clean_fallbacks():
  """Forget fallbacks recorded before (and after) the test."""
  guard.clear_fallbacks()
  yield
  guard.clear_fallbacks()
