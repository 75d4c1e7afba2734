"""For tests that compile for a TPU target: skip cleanly without libtpu,
saying how to get it; fail instead where CI installed it.

CI (`.ci/run`) installs `hlo-audit[tpu-target]` in one run and sets
`HLO_AUDIT_TPU_TARGET=required` there; elsewhere a run without libtpu skips.
"""

from __future__ import annotations

import os

import pytest

#: The environment variable CI sets (see the module docstring).
ENV = "HLO_AUDIT_TPU_TARGET"


def tpu_target_problem() -> str | None:
  """Why a TPU target cannot compile here, or None when it can."""
  from hlo_audit._src.errors import TargetError
  from hlo_audit._src.target import wheels

  try:
    wheels.require_tpu_wheel()
  except TargetError as e:
    return str(e)
  return None


def require_tpu_target() -> None:
  """Skips the calling test when a TPU target cannot compile here (fails
  when CI said libtpu is installed)."""
  problem = tpu_target_problem()
  if problem is None:
    return
  if os.environ.get(ENV, "") == "required":
    pytest.fail(f"CI installed hlo-audit[tpu-target], yet: {problem}")
  pytest.skip(problem)


@pytest.fixture
def tpu_target():
  """Skips (or fails, in CI) unless a TPU target compiles here."""
  require_tpu_target()
