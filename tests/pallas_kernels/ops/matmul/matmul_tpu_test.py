"""matmul on a TPU: the Mosaic TPU kernel in TPU interpret mode against the
reference (a fallback fails), forward and backward, compiled for v5e and v6e,
and the TPU guard's reasons."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import guard
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul.config import Config
from tests.tpu_target import require_tpu_target

TPU = backend.Target(backend.Backend.TPU, "TPU v5 lite", abstract=True)
#: 128-lane tiles on shapes that are not multiples of them: ragged M and N
#: edge blocks, K zero-padded (300 -> 384, three K steps).
SMALL_TILES = Config(block_m=128, block_n=128, block_k=128)


def _normal(key, shape, dtype, scale=1.0):
  return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


def _case(name, *, x, w, dtype, residual=None, **kwargs) -> pk.Case:
  """Positional (x, w, bias[, residual]) as the matmul spec takes them."""
  keys = jax.random.split(jax.random.key(len(name)), 4)
  n = w[-2] if kwargs.get("transpose_w") else w[-1]
  args = [_normal(keys[0], x, dtype), _normal(keys[1], w, dtype, 0.1),
          _normal(keys[2], (n,), dtype)]
  if residual is not None:
    args.append(_normal(keys[3], residual, dtype))
  if jnp.dtype(dtype) == jnp.float32:
    kwargs["precision"] = "highest"
  return pk.Case(name=name, args=tuple(args), kwargs=dict(kwargs, config=SMALL_TILES),
                 grad_argnums=tuple(range(len(args))))


CASES = {
    # x's batch folds into M; every epilogue step at once.
    "float32 full epilogue": dict(
        x=(2, 300, 300), w=(300, 200), dtype="float32", residual=(2, 300, 200),
        activation="gelu", scale=0.5, clamp=(-1.0, 2.0)),
    # Both operands read transposed in place, batched w, bf16 in, f32 out.
    "bfloat16 transposed": dict(
        x=(2, 300, 136), w=(2, 200, 300), dtype="bfloat16",
        activation="silu", transpose_x=True, transpose_w=True, out_dtype="float32"),
    # (x w)^T as w^T x^T: bias per row of the stored result, residual as stored.
    "float32 transpose_out": dict(
        x=(136, 300), w=(300, 200), dtype="float32", residual=(200, 136),
        activation="relu", transpose_out=True),
    # A bf16 output, no activation (the backward's identity path: dy is the
    # gemms' g), K one unpadded block.
    "bfloat16 residual": dict(
        x=(3, 50, 100), w=(100, 130), dtype="bfloat16", residual=(3, 50, 130)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tpu_kernel_matches_the_reference_in_tpu_interpret_mode(name):
  case = _case(name, **CASES[name])
  spec = dataclasses.replace(pk.get_spec("matmul"), cases=lambda tag, seed: iter((case,)))
  report = pk.validate(spec, target="tpu", interpret=True, require_kernel=True)
  assert report.passed, str(report)
  (row,) = report.rows
  assert row.backend == tpu_lib.KERNEL_BACKEND and row.grad_err is not None


def test_every_activation_in_tpu_interpret_mode():
  keys = jax.random.split(jax.random.key(1), 3)
  x = _normal(keys[0], (24, 200), jnp.float32, 2.0)
  w = _normal(keys[1], (200, 136), jnp.float32, 0.1)
  b = _normal(keys[2], (136,), jnp.float32)
  for act in reference.ACTIVATIONS:
    with backend.targeting(TPU), guard.collect_fallbacks() as records:
      got = pk.matmul(x, w, bias=b, activation=act, interpret=True, config=SMALL_TILES)
    assert not list(records), act
    want = reference.reference(x, w, bias=b, activation=act,
                               precision=jax.lax.Precision.HIGHEST)
    assert jnp.allclose(got, want, atol=2e-5, rtol=2e-5), act


@pytest.mark.parametrize("target", ["v5e", "v6e"])
def test_compiles_for_a_tpu_to_tpu_custom_calls_priced_by_the_cost_estimate(target):
  require_tpu_target()
  import hlo_audit

  device = hlo_audit.get_target(target).devices()[0]
  sh = jax.sharding.SingleDeviceSharding(device)
  m, k, n = 512, 1024, 768
  x, w, b, r = (jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=sh)
                for s in ((m, k), (k, n), (n,), (m, n)))
  f = lambda x, w, b, r: pk.matmul(x, w, bias=b, activation="gelu", residual=r)
  with guard.collect_fallbacks() as records:
    fwd = jax.jit(f).trace(x, w, b, r).lower().compile()
    loss = lambda *a: jnp.sum(f(*a).astype(jnp.float32))
    bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(x, w, b, r).lower().compile()
  assert not list(records)
  call = 'custom_call_target="tpu_custom_call"'
  assert fwd.as_text().count(call) == 1
  assert bwd.as_text().count(call) == 3  # forward (with aux), dx, dW
  # The forward program is the kernel alone: XLA prices it by its
  # CostEstimate, 2MNK plus gelu's 29 flops, the bias and the residual add.
  assert fwd.cost_analysis()["flops"] == 2 * m * n * k + (29 + 2) * m * n
  assert bwd.cost_analysis()["flops"] >= 3 * 2 * m * n * k


def _reasons(fn) -> list[str]:
  """Fallback reasons recorded while tracing `fn` for a TPU (nothing runs)."""
  with backend.targeting(TPU), guard.collect_fallbacks() as records:
    fn()
  return [r.reason for r in records]


S = jax.ShapeDtypeStruct


def test_tpu_guard_reasons():
  def call(x=(256, 512), w=(512, 384), dtype="float32", w_dtype=None, **kw):
    args = S(x, dtype), S(w, w_dtype or dtype)
    return lambda: jax.eval_shape(lambda *a: pk.matmul(*a, interpret=True, **kw), *args)

  assert _reasons(call()) == []
  (q,) = _reasons(call(quantize="int8"))
  assert q.startswith("quantize='int8' has no TPU kernel")
  (cs,) = _reasons(call(w_column_sum=True))
  assert cs.startswith("w_column_sum: the TPU matmul emits no column sums")
  (dq,) = _reasons(call(w_dtype="int8", w_scale=0.5))
  assert "dequantizing prologue has no TPU kernel" in dq
  (f16,) = _reasons(call(dtype="float16"))
  assert f16.startswith("dtype float16 has no TPU kernel")
  big = Config(block_m=2048, block_n=2048, block_k=1024)
  (vmem,) = _reasons(call(x=(4096, 4096), w=(4096, 4096), config=big))
  assert f"over the {tpu_lib.VMEM_BUDGET_BYTES // 2**20} MiB budget" in vmem
  assert _reasons(call(x=(4096, 4096), w=(4096, 4096))) == []  # the heuristic shrinks


@pytest.mark.parametrize("transpose_w, transpose_out, refused", [
    # rows are M = 4096: a requested bm of 2048 is taken whole, past VMEM.
    (True, False, "tiles bm=2048 bn=256 bk=256 need 26.8 MiB of VMEM"),
    # transposed out, rows are N = 256: one 256-row block, which fits.
    (False, True, None),
])
def test_the_tpu_guard_tiles_the_call_as_its_transposes_lay_it_out(
    transpose_w, transpose_out, refused):
  from pallas_kernels._src.ops.matmul import guard as matmul_guard  # pylint: disable=import-outside-toplevel
  x = jax.ShapeDtypeStruct((4096, 256), jnp.float32)
  w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
  reason = matmul_guard.tpu_unsupported_reason(
      x, w, out_dtype=jnp.float32, transpose_w=transpose_w, transpose_out=transpose_out,
      requested=(2048, 512, 2048))
  assert (reason is None) if refused is None else refused in reason, reason
