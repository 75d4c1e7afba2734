"""The matmul's fused quantizing epilogue with N ragged against block_n:
the padding columns of the tile never enter a row's amax, even where the
epilogue is not zero at zero."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import guard
from pallas_kernels._src.ops.matmul import kernel
from pallas_kernels._src.ops.matmul.config import Config
from pallas_kernels._src.ops.matmul.reference import reference as ref
from pallas_kernels._src.tolerances import relative_error, tolerance

M, K, N = 24, 32, 40
#: One tile spans each row (the kernel quantizes it itself) with 24 padding
#: columns: N = 40 in a block_n of 64.
CONFIG = Config(block_m=16, block_n=64, block_k=16, num_warps=4, num_stages=2, group_m=1)


def _operands():
  rng = np.random.default_rng(0)
  x = jnp.asarray(0.1 * rng.standard_normal((M, K)), jnp.float32)
  w = jnp.asarray(0.1 * rng.standard_normal((K, N)), jnp.float32)
  # sigmoid(0) = 0.5 in the padding columns; the real columns sit near
  # sigmoid(-4) = 0.018: a padding column in the amax would scale every row
  # ~25x too coarsely.
  bias = jnp.full((N,), -4.0, jnp.float32)
  return x, w, bias


@pytest.mark.parametrize("kind,transpose_out", [
    ("int8", False), ("int8", True), ("float8_e4m3fn", False)])
def test_padding_columns_stay_out_of_the_row_amax(clean_fallbacks, monkeypatch, kind,
                                                  transpose_out):
  x, w, bias = _operands()
  kw = dict(bias=bias, activation="sigmoid", quantize=kind, transpose_out=transpose_out)
  # Guards and the kernel choice run when a call is traced: trace afresh.
  guard.retrace_guards()
  fused = []
  real = kernel.matmul_forward
  monkeypatch.setattr(kernel, "matmul_forward",
                      lambda *a, **k: fused.append(k["quantize"]) or real(*a, **k))
  values, scales = pk.matmul(x, w, implementation="pallas", interpret=True, config=CONFIG,
                             **kw)
  assert not pk.fallbacks(), pk.fallbacks()
  assert fused == [kind]  # the kernel quantized, not XLA after it
  want_values, want_scales = ref(x, w, **kw)
  assert scales.shape == want_scales.shape == ((1, M) if transpose_out else (M, 1))
  # The real row amax is ~0.02; 0.5 / qmax would be the padding's.
  qmax = 127.0 if kind == "int8" else 448.0
  assert float(jnp.max(scales)) < 0.1 / qmax
  np.testing.assert_allclose(np.asarray(scales), np.asarray(want_scales), rtol=1e-5)
  assert relative_error(values.astype(jnp.float32), want_values.astype(jnp.float32)) <= \
      tolerance(kind)
  y = ref(x, w, bias=bias, activation="sigmoid", transpose_out=transpose_out,
          out_dtype="float32")
  assert relative_error(values.astype(jnp.float32) * scales, y) <= tolerance(kind)
