"""layer_norm / rms_norm on a TPU: the Mosaic TPU kernels in TPU interpret mode
against the reference (a fallback fails), compiled for v5e and v6e, and the
TPU guard's reasons."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import guard
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops.normalization.config import Config
from tests.tpu_target import require_tpu_target

TPU = backend.Target(backend.Backend.TPU, "TPU v5 lite", abstract=True)
KINDS = ("layer_norm", "rms_norm")


def _args(kind: str, shape, dtype, residual: bool, seed: int = 0):
  keys = jax.random.split(jax.random.key(seed), 4)
  n = shape[-1]
  args = [jax.random.normal(keys[0], shape, dtype),
          jax.random.normal(keys[1], (n,), dtype)]
  if kind == "layer_norm":
    args.append(jax.random.normal(keys[2], (n,), dtype))
  if residual:
    args.append(jax.random.normal(keys[3], shape, dtype))
  return tuple(args)


def _case(kind: str, shape, dtype, *, residual: bool, block_rows: int, **kwargs) -> pk.Case:
  args = _args(kind, shape, dtype, residual)
  # Row blocks smaller than the rows: a ragged last block in both passes.
  cfg = Config(block_rows=block_rows, block_cols=128)
  return pk.Case(name=f"{kind} {dtype} {shape}", args=args,
                 kwargs=dict(kwargs, config=cfg, backward_config=cfg),
                 grad_argnums=tuple(range(len(args))))


# Widths 200 and 136 are not multiples of 128; 300 and 150 rows are not
# multiples of the blocks (128 and 64).
CASES = {
    "float32": dict(shape=(300, 200), dtype="float32", residual=True, block_rows=128),
    "bfloat16": dict(shape=(3, 50, 136), dtype="bfloat16", residual=True, block_rows=64,
                     out_dtype="float32"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", sorted(CASES))
def test_tpu_kernels_match_the_reference_in_tpu_interpret_mode(kind, dtype):
  case = _case(kind, **CASES[dtype])
  spec = dataclasses.replace(pk.get_spec(kind), cases=lambda tag, seed: iter((case,)))
  report = pk.validate(spec, target="tpu", interpret=True, require_kernel=True)
  assert report.passed, str(report)
  (row,) = report.rows
  assert row.backend == tpu_lib.KERNEL_BACKEND and row.grad_err is not None


@pytest.mark.parametrize("target", ["v5e", "v6e"])
@pytest.mark.parametrize("kind", KINDS)
def test_compiles_for_a_tpu_to_a_tpu_custom_call_priced_by_its_cost_estimate(target, kind):
  require_tpu_target()
  import hlo_audit

  device = hlo_audit.get_target(target).devices()[0]
  sh = jax.sharding.SingleDeviceSharding(device)
  rows, n = 300, 200
  args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
          for a in _args(kind, (rows, n), jnp.bfloat16, residual=True)]
  fn = pk.layer_norm if kind == "layer_norm" else pk.rms_norm
  with guard.collect_fallbacks() as records:
    fwd = jax.jit(lambda *a: fn(*a[:-1], residual=a[-1])).trace(*args).lower().compile()
    loss = lambda *a: jnp.sum(fn(*a[:-1], residual=a[-1])[0].astype(jnp.float32))
    bwd = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(*args).lower().compile()
  assert not list(records)
  call = 'custom_call_target="tpu_custom_call"'
  assert fwd.as_text().count(call) == 1
  assert bwd.as_text().count(call) == 2  # forward (with statistics) and backward
  # The forward program is the kernel alone: XLA prices it by our CostEstimate.
  per_elem = 8 if kind == "layer_norm" else 6
  assert fwd.cost_analysis()["flops"] == per_elem * rows * n
  assert bwd.cost_analysis()["flops"] >= (per_elem + 12) * rows * n


def _reasons(fn) -> list[str]:
  """Fallback reasons recorded while tracing `fn` for a TPU (nothing runs)."""
  with backend.targeting(TPU), guard.collect_fallbacks() as records:
    fn()
  return [r.reason for r in records]


S = jax.ShapeDtypeStruct


@pytest.mark.parametrize("kind", KINDS)
def test_tpu_guard_reasons(kind):
  fn = pk.layer_norm if kind == "layer_norm" else pk.rms_norm

  def call(shape, dtype="float32", **kw):
    args = [S(shape, dtype), S(shape[-1:], dtype)] + (
        [S(shape[-1:], dtype)] if kind == "layer_norm" else [])
    return lambda: jax.eval_shape(lambda *a: fn(*a, interpret=True, **kw), *args)

  (q,) = _reasons(call((16, 256), quantize="int8"))
  assert q.startswith("quantize='int8' has no TPU kernel")
  (f16,) = _reasons(call((16, 256), "float16"))
  assert f16.startswith("dtype float16 has no TPU kernel")
  (wide,) = _reasons(call((16, 1 << 20)))
  assert f"over the {tpu_lib.VMEM_BUDGET_BYTES // 2**20} MiB budget" in wide
  (block,) = _reasons(call((4096, 8192), config=Config(block_rows=1024, block_cols=128)))
  assert block.startswith("a block of 1024 rows of width 8192")
  assert _reasons(call((4096, 8192))) == []  # the heuristic block fits

  # The forward fits, the backward's block (more buffers) does not: the
  # backward runs XLA's vjp and says why.
  x = S((8, 50_000), "float32")
  params = [S((50_000,), "float32")] * (2 if kind == "layer_norm" else 1)
  loss = lambda *a: jnp.sum(fn(*a, interpret=True))
  (bwd,) = _reasons(lambda: jax.eval_shape(jax.grad(loss), x, *params))
  assert bwd.startswith("backward: a block of 8 rows of width 50000")
