"""Every kernel's default config compiles for sm_90a and sm_80 without spilling.

The kernels' Triton IR, lowered for an abstract H200 / A100, is compiled with
the pip `triton` package (its ptxas): registers, spills and shared memory come
from the real compiler, no GPU needed. Skipped without `triton`, and on a JAX
whose Triton IR this Triton cannot read (older than 0.12 with Triton 3.9).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("triton")

from pallas_kernels._src import gpu_report  # noqa: E402
from pallas_kernels._src.ops.matmul import config as config_lib  # noqa: E402
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu  # noqa: E402

pytestmark = pytest.mark.slow
S = jax.ShapeDtypeStruct


@functools.cache
def _unreadable() -> str | None:
  import pallas_kernels as pk  # noqa: PLC0415
  fn = lambda x, w: pk.matmul(x, w, implementation="pallas", backend="triton")
  spec = S((64, 64), jnp.bfloat16)
  [kernel] = gpu_report.kernel_irs(gpu_report.lower_for("sm_90a", fn, spec, spec))
  try:
    gpu_report.compile_kernel("probe", kernel, "sm_90a")
  except gpu_report.IrUnreadable as e:
    return str(e)
  return None


@pytest.fixture(autouse=True)
def _readable_ir():
  reason = _unreadable()
  if reason:
    pytest.skip(reason)


_CASES = {c.name: c for c in gpu_report.default_cases()}


@pytest.mark.parametrize("arch", sorted(gpu_report.ARCHS))
@pytest.mark.parametrize("name", sorted(_CASES))
def test_default_config_fits(name, arch):
  result = gpu_report.report([_CASES[name]], (arch,))
  rows = result.rows
  if arch == "sm_80" and "fp8" in name:
    # float8 conversions need sm_89: the guard falls back, and says why.
    assert not rows and "compute capability >= 8.9" in result.fallbacks[0][2]
    return
  assert not result.fallbacks
  assert rows, "no kernel compiled"
  for r in rows:
    assert r.spills == 0, f"{r.kernel} spills {r.spill_stores}/{r.spill_loads} B"
    assert r.shared <= gpu_report.SMEM_LIMIT[arch], r
    if name.startswith("matmul") and r.kernel == "pallas_kernels_matmul":
      # Tensor cores wherever the precision allows; IEEE f32 is FMA by definition.
      # wgmma needs 64-row tiles: a decode tile (16 rows) uses mma.sync.
      hopper = arch == "sm_90a" and "decode" not in name
      want = "fma" if "highest" in name else ("wgmma" if hopper else "mma")
      assert r.dot_unit == want, r


# (label, w dtype, transpose_w, group): the quantized operands whose shared
# memory the guard's estimate must not undercount.
_QUANT = [("int8", jnp.int8, False, None), ("fp8", jnp.float8_e4m3fn, False, None),
          ("int4", jnp.int4, False, 128), ("int4 transpose_w", jnp.int4, True, 128)]


@pytest.mark.parametrize("arch", sorted(gpu_report.ARCHS))
@pytest.mark.parametrize("label,wdt,tw,group", _QUANT)
def test_shared_memory_estimate_errs_high(label, wdt, tw, group, arch):
  import pallas_kernels as pk  # noqa: PLC0415
  if arch == "sm_80" and wdt == jnp.float8_e4m3fn:
    pytest.skip("float8 needs sm_89")
  m, k, n = 8192, 512, 8192
  with jax.sharding.use_abstract_mesh(gpu_report.abstract_mesh(arch)):
    cfg = config_lib.choose_config(m, n, k, jnp.bfloat16, False, group_size=group,
                                   packed_n=wdt == jnp.int4 and not tw)
  wbytes = 0.5 if wdt == jnp.int4 else jnp.dtype(wdt).itemsize
  estimate = matmul_gpu.pipeline_smem_bytes(cfg.block_m, cfg.block_n, cfg.block_k, 2,
                                            wbytes, cfg.num_stages, compute_itemsize=2)
  fn = lambda x, w, s: pk.matmul(x, w, w_scale=s, w_group_size=group, transpose_w=tw,
                                 implementation="pallas", backend="triton", config=cfg)
  specs = (S((m, k), jnp.bfloat16), S((n, k) if tw else (k, n), wdt),
           S((k // group, n) if group else (n,), jnp.float32))
  [row] = gpu_report.report([gpu_report.Case(label, fn, specs)], (arch,)).rows
  assert row.shared <= estimate, f"{label} on {arch}: {row.shared} B used, {estimate} estimated"


# (dtype, config): the heuristic's tiles and pipelined ones, whose shared memory
# linear_cross_entropy's guard estimate must not undercount.
_LCE = [("bfloat16", (64, 128, 64, 8, 1)), ("bfloat16", (64, 128, 64, 8, 2)),
        ("float32", (64, 128, 16, 8, 1)), ("float32", (32, 64, 32, 4, 2))]


@pytest.mark.parametrize("dtype,blocks", _LCE)
def test_linear_cross_entropy_shared_memory_estimate_errs_high(dtype, blocks):
  from pallas_kernels._src.ops.linear_cross_entropy import api  # noqa: PLC0415
  from pallas_kernels._src.ops.linear_cross_entropy import config as lce_config  # noqa: PLC0415
  cfg = lce_config.Config(*blocks)
  d = 1024
  loss = lambda x, w, l: api.linear_cross_entropy(x, w, l, implementation="pallas",
                                                  config=cfg)
  specs = (S((1024, d), dtype), S((d, 4096), dtype), S((1024,), jnp.int32))
  result = gpu_report.report([gpu_report.Case("lce", jax.grad(loss, (0, 1)), specs)],
                             ("sm_90a",))
  estimate = lce_config.shared_memory(cfg, d, jnp.dtype(dtype).itemsize)
  assert len(result.rows) == 2, result
  for r in result.rows:
    assert r.spills == 0, r
    assert r.shared <= estimate, f"{r.kernel}: {r.shared} B used, {estimate} estimated"
