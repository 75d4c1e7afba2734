"""When the linear_cross_entropy kernels cannot run, and why (then XLA runs)."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops import rows
from pallas_kernels._src.ops.linear_cross_entropy import config as config_lib

#: dtypes of x, w and bias the kernels are written and validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})
#: Elements a kernel can address in one operand (offsets are int32).


def _shape(dims) -> str:
  return f"[{','.join(map(str, dims))}]"


def unsupported_reason(*, x_shape: tuple[int, ...], x_dtype, w_shape: tuple[int, ...],
                       w_dtype, bias_dtype, labels_dtype, interpret: bool,
                       config: config_lib.Config | None = None,
                       compute_dtype=None) -> str | None:
  """Why the kernels cannot run these arguments, or None if they can.

  Args:
    x_shape: shape of x [..., D] (already validated by the API).
    x_dtype: dtype of x.
    w_shape: shape of w [D, V].
    w_dtype: dtype of w.
    bias_dtype: dtype of bias, or None.
    labels_dtype: dtype of labels.
    interpret: whether the kernels would run in interpret mode.
    config: the tiling asked for; None: the one `heuristic_config` picks.
    compute_dtype: the dtype x and w are rounded to on load (None: their
      promotion).
  """
  reason = gpu.unavailable_reason(interpret)
  if reason:
    return reason
  for name, dt, dims in (("x", x_dtype, x_shape), ("w", w_dtype, w_shape),
                         ("bias", bias_dtype, w_shape[-1:])):
    if dt is not None and jnp.dtype(dt).name not in SUPPORTED_DTYPES:
      return (f"{name} dtype {jnp.dtype(dt).name} (shape {_shape(dims)}) "
              f"{gpu.not_one_of(SUPPORTED_DTYPES)}")
  if compute_dtype is not None and jnp.dtype(compute_dtype).name not in SUPPORTED_DTYPES:
    return (f"compute dtype {jnp.dtype(compute_dtype).name} "
            f"{gpu.not_one_of(SUPPORTED_DTYPES)}")
  if not jnp.issubdtype(labels_dtype, jnp.integer):
    return (f"labels dtype {jnp.dtype(labels_dtype).name} (shape "
            f"{_shape(x_shape[:-1])}) is not an integer type")
  reason = rows.rows_reason(x_shape)
  if reason:
    return f"{reason} (x shape {_shape(x_shape)})"
  d, vocab = w_shape
  tokens = 1
  for n in x_shape[:-1]:
    tokens *= n
  tiles = jnp.promote_types(x_dtype, w_dtype)
  cfg = config or config_lib.heuristic_config(tokens, d, vocab, _tiling_backend(interpret),
                                              tiles.itemsize)
  dp = config_lib.padded_d(cfg, d)
  if max(tokens, vocab) * dp > gpu.MAX_ELEMENTS:
    return (f"x {_shape(x_shape)} or w {_shape(w_shape)} padded to D={dp} has more "
            f"elements than the kernels' int32 offsets address")
  cc = None if interpret else gpu.compute_capability()
  if cc is not None:
    need = config_lib.shared_memory(cfg, d, tiles.itemsize)
    limit = gpu.shared_memory_per_block(cc)
    if need > limit:
      return (f"{cfg} for x {_shape(x_shape)}, w {_shape(w_shape)} "
              f"({tiles.name} tiles) needs up to "
              f"{need // 1024} KiB of shared memory per block, over the "
              f"{limit // 1024} KiB a block may use on sm_{cc}")
  return None


def _tiling_backend(interpret: bool) -> backend_lib.Backend:
  """The backend whose blocks the API picks (interpret mode tiles as the CPU)."""
  return backend_lib.Backend.CPU if interpret else backend_lib.current_backend()
