"""The Mosaic GPU (Hopper) matmul, validated on a CPU in Mosaic GPU's interpret mode.

`validate(..., target="h200", interpret=True, require_kernel=True)` builds
each "mosaic" case as an H200 would (the Mosaic GPU kernel, its tiling and
guards) and runs it in Mosaic GPU's interpreter against the float32 ground
truth: a fallback to XLA fails the row. Needs jax >= 0.11 (0.10.2's Mosaic
GPU has no interpret mode).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import compat
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.matmul import config as config_lib
from pallas_kernels._src.ops.matmul import guard
from pallas_kernels._src.ops.matmul.config import MosaicConfig

pytestmark = pytest.mark.skipif(compat.mosaic_gpu_unavailable_reason() is not None,
                                reason=str(compat.mosaic_gpu_unavailable_reason()))
S = jax.ShapeDtypeStruct
H200 = "h200"


@pytest.fixture(autouse=True)
def _clean():
  guard_lib.clear_fallbacks()
  yield
  guard_lib.clear_fallbacks()


@pytest.fixture(scope="module")
def report():
  return pk.validate("matmul", tags=("mosaic",), target=H200, interpret=True,
                     require_kernel=True)


def test_every_case_validates_with_the_kernel(report):
  assert report.passed and report.require_kernel, str(report)
  assert "NVIDIA H200" in report.device and report.interpret
  assert len(report.rows) >= 15 and not any(r.fallback for r in report.rows)


def test_rows_name_the_backend(report):
  by_case = {r.case: r.backend for r in report.rows}
  # IEEE float32 (Precision.HIGHEST) is the Triton kernel's: wgmma has TF32 only.
  highest = [c for c in by_case if c.startswith("x=f32") and "precision" not in c]
  assert highest and all(by_case[c] == "triton" for c in highest), by_case
  # Forward, dx and dw on Mosaic GPU; a backward's element-wise dAct +
  # bias-gradient pass is Triton's (recorded, so the row says so).
  grads = {r.case for r in report.rows if r.grad_err is not None}
  for case, built in by_case.items():
    if case not in highest:
      assert built == ("mosaic_gpu+triton" if case in grads else "mosaic_gpu"), (case, built)
  text = str(report)
  assert "backend" in text.splitlines()[1] and "mosaic_gpu" in text


def _choice(fn, *specs, target=H200):
  """(the backend an eval_shape of fn builds, why, fallback reasons)."""
  with backend.targeting(backend.resolve_target(target)):
    jax.eval_shape(fn, *specs)
  choices = guard_lib.choices("matmul")
  reasons = [f.reason for f in pk.fallbacks("matmul")]
  guard_lib.clear_fallbacks()
  return (choices[-1].backend if choices else None,
          choices[-1].why if choices else "", reasons)


BF = jnp.bfloat16
ALIGNED = (S((256, 512), BF), S((512, 256), BF))


def test_the_target_picks_the_backend():
  mm = lambda x, w: pk.matmul(x, w, implementation="pallas", interpret=True)
  assert _choice(mm, *ALIGNED)[0] == "mosaic_gpu"
  kind, why, _ = _choice(mm, *ALIGNED, target="a100")
  assert kind == "triton" and "has no wgmma" in why
  triton = lambda x, w: pk.matmul(x, w, implementation="pallas", interpret=True,
                                  backend="triton")
  assert _choice(triton, *ALIGNED)[0] == "triton"


def test_an_unaligned_shape_runs_on_triton_and_says_why():
  mm = lambda x, w: pk.matmul(x, w, implementation="pallas", interpret=True)
  kind, why, reasons = _choice(mm, S((300, 512), BF), S((512, 256), BF))
  assert kind == "triton" and not reasons
  assert why.startswith("mosaic_gpu: x bfloat16[300, 512]: Mosaic GPU's TMA copies whole "
                        "tiles of 8 rows"), why


def test_a_named_backend_that_cannot_run_falls_back_to_xla():
  mm = lambda x, w: pk.matmul(x, w, implementation="pallas", interpret=True,
                              backend="mosaic_gpu")
  kind, _, reasons = _choice(mm, S((256, 512), BF), S((512, 136), BF))
  assert kind is None
  assert reasons and reasons[0].startswith("mosaic_gpu: w bfloat16[512, 136]"), reasons


@pytest.mark.parametrize("kwargs,shapes,expected", [
    ({"precision": "highest"}, ((256, 512, jnp.float32), (512, 256, jnp.float32)),
     "float32 at Precision.HIGHEST"),
    ({"transpose_out": True}, ((256, 512, BF), (512, 256, BF)), "transpose_out"),
    ({"w_scale": 1.0, "x_scale": 1.0}, ((256, 512, jnp.int8), (512, 256, jnp.int8)),
     "would both be converted"),
    ({}, ((256, 36, BF), (36, 256, BF)), "a row here is 72 bytes"),
])
def test_guard_names_the_shape_or_dtype(kwargs, shapes, expected):
  (m, k, xd), (k2, n, wd) = shapes
  x, w = S((m, k), xd), S((k2, n), wd)
  cfg = MosaicConfig()
  with backend.targeting(backend.resolve_target(H200)):
    reason = guard.mosaic_unsupported_reason(
        x, w, out_dtype=BF, transpose_out=kwargs.get("transpose_out", False),
        precision=kwargs.get("precision", "default").upper(), interpret=True, config=cfg)
  assert reason is not None and expected in reason, reason


def test_heuristic_config_is_jaxs_for_16_bit_and_adapts():
  common = dict(out_dtype=BF, compute_dtype=BF)
  cfg = config_lib.heuristic_mosaic_config(4096, 4096, 4096, x_dtype=BF, w_dtype=BF, **common)
  assert (cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.stages, cfg.compute_wgs,
          cfg.wg_dimension) == (128, 128, 64, 4, 2, "n")
  staged = config_lib.heuristic_mosaic_config(16, 8192, 8192, x_dtype=BF, w_dtype=jnp.int8,
                                              **common)
  assert staged.compute_wgs == 1
  native = config_lib.heuristic_mosaic_config(4096, 4096, 4096, x_dtype=jnp.int8,
                                              w_dtype=jnp.int8, transpose_w=True, **common)
  assert native.tile_k == 128 and native.compute_wgs == 2
  f32 = config_lib.heuristic_mosaic_config(4096, 4096, 4096, x_dtype=jnp.float32,
                                           w_dtype=jnp.float32, out_dtype=jnp.float32,
                                           compute_dtype=jnp.float32)
  assert f32.tile_k == 32
  # A fused quantize keeps each row in one tile: N up to 256 in one tile_n.
  quant = config_lib.heuristic_mosaic_config(4096, 200, 4096, x_dtype=BF, w_dtype=BF,
                                             fused_quantize=True, **common)
  assert (quant.tile_m, quant.tile_n, quant.wg_dimension) == (64, 256, "m")
  wide = config_lib.heuristic_mosaic_config(4096, 1024, 4096, x_dtype=BF, w_dtype=BF,
                                            fused_quantize=True, **common)
  assert wide.tile_n == cfg.tile_n
  assert config_lib.mosaic_smem_bytes(
      f32, x_dtype=jnp.float32, w_dtype=jnp.float32, compute_dtype=jnp.float32,
      out_dtype=jnp.float32) <= config_lib.gpu.shared_memory_bytes_of("H200")


def test_mosaic_config_checks_itself():
  with pytest.raises(ValueError, match="tile_m must be a multiple of 64"):
    MosaicConfig(tile_m=96)
  with pytest.raises(ValueError, match="compute_wgs must be 1 or 2"):
    MosaicConfig(compute_wgs=3)
  # Each bound apart: a config failing two would pass a check that dropped one.
  for bad in (dict(stages=0), dict(grid_tile_width=0)):
    with pytest.raises(ValueError, match="stages and grid_tile_width must be >= 1"):
      MosaicConfig(**bad)
  assert MosaicConfig(stages=1, grid_tile_width=1).stages == 1
  with pytest.raises(ValueError, match="a MosaicConfig configures the Mosaic GPU kernel"):
    pk.matmul(jnp.ones((8, 8)), jnp.ones((8, 8)), config=MosaicConfig(), backend="triton")
