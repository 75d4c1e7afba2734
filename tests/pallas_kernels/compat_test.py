"""Version facts: version parsing, scan's operand layout (in swap_test), and
the Triton deprecation: jax's per-lowering warning silenced, ours given once."""

from __future__ import annotations

import warnings

from hlo_audit import parse_version as parse
from pallas_kernels._src import compat


def test_parse_version():
  assert parse("0.12.0.1") == (0, 12, 0, 1)
  assert parse("0.11.0rc1") == (0, 11, 0)
  assert parse("0.13.0.dev20261130") == (0, 13, 0)
  assert parse("0.10.2") < (0, 11) <= parse("0.11.2") < parse("0.12.0.1")
  assert compat.JAX_VERSION == parse(compat.jax.__version__) >= (0, 10)


def test_triton_deprecation_is_said_once_and_jax_warning_silenced(monkeypatch):
  monkeypatch.setattr(compat, "TRITON_DEPRECATED", True)
  monkeypatch.setattr(compat, "_noticed", False)
  with warnings.catch_warnings(record=True) as log:
    warnings.simplefilter("always")
    for _ in range(3):
      compat.triton_compiler_params(num_warps=4, num_stages=2)
    # What jax says at each lowering, as jax says it.
    warnings.warn(compat.JAX_TRITON_WARNING + " and will be removed in a future JAX "
                  "version.", DeprecationWarning)
  messages = [str(w.message) for w in log]
  assert len(messages) == 1 and log[0].category is FutureWarning, messages
  assert messages[0].startswith("pallas_kernels compiles this kernel through Pallas's Triton")
  assert "Mosaic GPU" in messages[0]
  assert "fall back to XLA" in messages[0]


def test_no_notice_where_triton_is_not_deprecated(monkeypatch):
  monkeypatch.setattr(compat, "TRITON_DEPRECATED", False)
  monkeypatch.setattr(compat, "_noticed", False)
  with warnings.catch_warnings(record=True) as log:
    warnings.simplefilter("always")
    params = compat.triton_compiler_params(num_warps=4, num_stages=2)
  assert not log
  assert params is None or params.num_warps == 4
