"""For tests that compile for a GPU target: skip cleanly without the plugin
wheels, saying how to get them; fail instead where CI installed them.

CI (`.ci/run`) installs `hlo-audit[gpu-target]` itself and sets
`HLO_AUDIT_GPU_TARGET=required`, or `=unavailable: <why>` when the registry
could not serve the wheels; only the latter, or a local run without the
wheels, skips.
"""

from __future__ import annotations

import os

import pytest

#: The environment variable CI sets (see the module docstring).
ENV = "HLO_AUDIT_GPU_TARGET"


def gpu_target_problem() -> str | None:
  """Why a GPU target cannot compile here, or None when it can."""
  from hlo_audit._src.target import wheels

  found = wheels.problems()
  if found:
    return f"needs the CUDA plugin wheels ({'; '.join(found)}): {wheels.pip_command()}"
  import jax

  if jax.default_backend() != "gpu" and os.environ.get("JAX_PLATFORMS") != "cpu":
    return ("the CUDA plugin starts without a GPU only with JAX_PLATFORMS=cpu: "
            "rerun with JAX_PLATFORMS=cpu")
  return None


def require_gpu_target() -> None:
  """Skips the calling test when a GPU target cannot compile here (fails
  when CI said the wheels are installed)."""
  problem = gpu_target_problem()
  if problem is None:
    return
  mode = os.environ.get(ENV, "")
  if mode == "required":
    pytest.fail(f"CI installed hlo-audit[gpu-target], yet: {problem}")
  if mode.startswith("unavailable"):
    pytest.skip(f"the package registry could not serve the GPU-target wheels "
                f"({mode.partition(':')[2].strip() or 'see the CI log'})")
  pytest.skip(problem)


@pytest.fixture
def gpu_target():
  """Skips (or fails, in CI) unless a GPU target compiles here."""
  require_gpu_target()
