"""softmax on a TPU: the Mosaic TPU kernels in TPU interpret mode against the
reference (a fallback fails), compiled for v5e and v6e, and the TPU guard's
reasons."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import guard
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops.softmax.config import Config
from tests.tpu_target import require_tpu_target

TPU = backend.Target(backend.Backend.TPU, "TPU v5 lite", abstract=True)


def _case(name: str, shape, dtype, *, mask=None, block_rows: int, **kwargs) -> pk.Case:
  kx, km = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, shape, dtype)
  args = [x]
  grad_argnums = (0,)
  if mask is not None:
    mask_shape, kind = mask
    if kind == "add":
      args.append(jax.random.normal(km, mask_shape, jnp.float32))
      grad_argnums = (0, 1)
    else:
      keep = jax.random.bernoulli(km, 0.7, mask_shape)
      args.append(keep.at[..., 0, :].set(False))  # a fully masked row
  # Row blocks smaller than the rows: a ragged last block in both passes.
  cfg = Config(block_rows=block_rows, block_cols=128)
  return pk.Case(name=name, args=tuple(args),
                 kwargs=dict(kwargs, config=cfg, backward_config=cfg),
                 grad_argnums=grad_argnums)


# Widths 200, 136 and 130 are not multiples of 128; 70, 40 and 150 rows are
# not multiples of their blocks.
CASES = {
    "f32 causal scale additive [q,k] mask": lambda: _case(
        "f32 causal", (2, 70, 200), jnp.float32, mask=((70, 200), "add"), scale=0.5,
        causal=True, block_rows=32),
    "bf16 boolean [b,1,k] mask bottom-right causal": lambda: _case(
        "bf16 bool", (3, 40, 136), jnp.bfloat16, mask=((3, 1, 136), "bool"), causal=True,
        causal_alignment="bottom_right", block_rows=16),
    "bf16 rows -> f32": lambda: _case(
        "bf16 rows", (150, 130), jnp.bfloat16, out_dtype="float32", block_rows=64),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tpu_kernels_match_the_reference_in_tpu_interpret_mode(name):
  case = CASES[name]()
  spec = dataclasses.replace(pk.get_spec("softmax"), cases=lambda tag, seed: iter((case,)))
  report = pk.validate(spec, target="tpu", interpret=True, require_kernel=True)
  assert report.passed, str(report)
  (row,) = report.rows
  assert row.backend == tpu_lib.KERNEL_BACKEND and row.grad_err is not None


@pytest.mark.parametrize("target", ["v5e", "v6e"])
def test_compiles_for_a_tpu_to_a_tpu_custom_call_priced_by_its_cost_estimate(target):
  require_tpu_target()
  import hlo_audit

  device = hlo_audit.get_target(target).devices()[0]
  sh = jax.sharding.SingleDeviceSharding(device)
  x = jax.ShapeDtypeStruct((2, 4, 70, 200), jnp.bfloat16, sharding=sh)
  mask = jax.ShapeDtypeStruct((70, 200), jnp.float32, sharding=sh)
  fn = lambda x, m: pk.softmax(x, mask=m, scale=0.125, causal=True)
  with guard.collect_fallbacks() as records:
    fwd = jax.jit(fn).trace(x, mask).lower().compile()
    loss = lambda x, m: jnp.sum(fn(x, m).astype(jnp.float32))
    bwd = jax.jit(jax.grad(loss)).trace(x, mask).lower().compile()
  assert not list(records)
  call = 'custom_call_target="tpu_custom_call"'
  assert fwd.as_text().count(call) == 1
  assert bwd.as_text().count(call) == 2
  elems = 2 * 4 * 70 * 200
  # The forward program is the kernel alone: XLA prices it by our CostEstimate.
  assert fwd.cost_analysis()["flops"] == 5 * elems
  assert bwd.cost_analysis()["flops"] >= (5 + 4) * elems


S = jax.ShapeDtypeStruct


def _reasons(fn) -> list[str]:
  """Fallback reasons recorded while tracing `fn` for a TPU (nothing runs)."""
  with backend.targeting(TPU), guard.collect_fallbacks() as records:
    fn()
  return [r.reason for r in records]


def test_tpu_guard_reasons():
  def call(shape, dtype="float32", mask=None, **kw):
    args = [S(shape, dtype)] + ([mask] if mask is not None else [])
    return lambda: jax.eval_shape(
        lambda x, *m: pk.softmax(x, mask=m[0] if m else None, interpret=True, **kw), *args)

  (f16,) = _reasons(call((16, 256), "float16"))
  assert f16.startswith("dtype float16 has no TPU kernel")
  (mask16,) = _reasons(call((16, 256), mask=S((16, 256), "float16")))
  assert mask16.startswith("dtype float16 has no TPU kernel")
  (wide,) = _reasons(call((16, 1 << 20)))
  assert f"over the {tpu_lib.VMEM_BUDGET_BYTES // 2**20} MiB budget" in wide
  (block,) = _reasons(call((4096, 8192), config=Config(block_rows=1024, block_cols=128)))
  assert block.startswith("a block of 1024 rows of width 8192")
  assert _reasons(call((4096, 8192))) == []  # the heuristic block fits

  # A narrower output than x: the backward runs XLA's vjp, as on a GPU.
  loss = lambda x: jnp.sum(pk.softmax(x, out_dtype=jnp.bfloat16, interpret=True)
                           .astype(jnp.float32))
  (narrow,) = _reasons(lambda: jax.eval_shape(jax.grad(loss), S((16, 256), "float32")))
  assert narrow.startswith("backward: out_dtype bfloat16 is less precise")
