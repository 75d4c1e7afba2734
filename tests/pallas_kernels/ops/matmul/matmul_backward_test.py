"""The backward kernels where the epilogue's order matters most: a transposed
output with a residual under a clamp (the clamp's mask depends on the
residual, so dropping it anywhere changes every gradient)."""

from __future__ import annotations

import pytest

import pallas_kernels as pk
from tests.pallas_kernels.ops.matmul.matmul_base import MatmulTestBase, operands


@pytest.mark.parametrize("dtype, activation, clamp", [
    ("float32", "gelu", (-0.5, 0.8)),
    ("float32", "relu", (None, 1.0)),
    ("bfloat16", "silu", (-1.0, None)),
])
def test_gradients_with_transposed_output_clamp_and_residual(dtype, activation, clamp):
  pk.clear_fallbacks()
  x, w, extra = operands(21, 35, 26, dtype, bias=True, residual=True, transpose_out=True,
                         tag=f"bwd-{activation}")
  MatmulTestBase().check_grads(x, w, ["x", "w", "bias", "residual"], activation=activation,
                               clamp=clamp, transpose_out=True, **extra)
  assert not pk.fallbacks(), pk.fallbacks()  # the kernels ran, not the reference
