"""Shared pytest setup: a GPU marker that skips cleanly without a GPU."""

from __future__ import annotations

import pytest


def _has_gpu() -> bool:
  try:
    import jax
    return jax.default_backend() == "gpu"
  except Exception:  # noqa: BLE001 - no JAX backend means no GPU
    return False


def pytest_collection_modifyitems(config, items):
  if _has_gpu():
    return
  skip = pytest.mark.skip(reason="needs a GPU (jax.default_backend() != 'gpu')")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)
