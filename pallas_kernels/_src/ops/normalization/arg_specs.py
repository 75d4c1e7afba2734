"""The specs of layer norm and RMS norm: cases and cost model for validate and
bench, sweep parameters, and the audit findings they close (`spec.py`).

Exports `LAYER_NORM_SPEC` and `RMS_NORM_SPEC`, and `SPECS` holding both (the
registry reads `SPECS`). In a case, positional args are (x, gamma, beta,
residual) for layer norm and (x, gamma, residual) for RMS norm, so that
gradients can be checked for the residual too.

Tags: "ci" (small, interpret-friendly, covering 1 row, prime and non-power-of-
two widths, leading dims, rows longer than the block, every epilogue and
dtype), "grad" (gradients checked), "nonfinite" (NaN/+Inf/-Inf rows), "bench"
(realistic sizes, e.g. 8192x8192 bfloat16).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import inputs
from pallas_kernels._src.ops import row_ops
from pallas_kernels._src.ops.normalization import api
from pallas_kernels._src.ops.normalization import reference
from pallas_kernels._src.ops.normalization.config import Config
from pallas_kernels._src.spec import Case, Closes, OpSpec

#: Forces two column chunks on short rows, to exercise the long-row path in CI.
CHUNKED = Config(block_rows=2, block_cols=128)


@dataclasses.dataclass(frozen=True, slots=True)
class _Def:
  shape: tuple[int, ...]
  dtype: str
  tags: frozenset[str]
  residual: bool = False
  out_dtype: str | None = None
  quantize: str | None = None
  chunked: bool = False
  nonfinite: bool = False


def _t(*tags: str) -> frozenset[str]:
  return frozenset(tags)


_DEFS: tuple[_Def, ...] = (
    # Width 1 is ci-only: its gradient (~eps / x^3 for RMS norm) is pure rounding
    # noise in float32, so no float32 ground truth exists to check it against.
    _Def((1, 1), "float32", _t("ci")),
    # float32 gradients of this case are checked by the op's tests; CI keeps
    # its validation run short by checking gradients on the two below.
    _Def((7, 129), "float32", _t("ci"), residual=True),
    _Def((3, 5, 67), "bfloat16", _t("ci", "grad"), residual=True, out_dtype="float32"),
    _Def((2, 131), "float16", _t("ci")),
    _Def((5, 300), "float32", _t("ci", "grad"), residual=True, chunked=True),
    _Def((6, 96), "bfloat16", _t("ci"), quantize="int8"),
    _Def((3, 64), "float32", _t("ci"), residual=True, quantize="float8_e4m3fn"),
    _Def((6, 33), "float32", _t("ci", "nonfinite"), residual=True),
    _Def((8192, 8192), "bfloat16", _t("bench")),
    _Def((8192, 8192), "bfloat16", _t("bench", "device"), residual=True),
    _Def((16384, 1024), "bfloat16", _t("bench"), residual=True),
    _Def((4096, 4096), "float32", _t("bench")),
    _Def((2048, 16384), "bfloat16", _t("bench")),
    _Def((8192, 8192), "bfloat16", _t("bench"), quantize="int8"),
)


def _name(d: _Def) -> str:
  parts = [inputs.describe("x", d.shape, d.dtype)]
  if d.residual:
    parts.append("+residual")
  if d.out_dtype:
    parts.append(f"->{inputs.short_dtype(d.out_dtype)}")
  if d.quantize:
    parts.append(f"q={d.quantize}")
  if d.chunked:
    parts.append(f"chunk={CHUNKED.block_cols}")
  if d.nonfinite:
    parts.append("nan/inf")
  return " ".join(parts)


def _poison_rows(x):
  """NaN, +Inf and -Inf into rows 1, 4 and 5 of a 2-D x (one entry each)."""
  x = np.array(x)
  x[1, 3] = np.nan
  x[4, 0] = np.inf
  x[5, -1] = -np.inf
  return jnp.asarray(x)


def _cases(kind: str):
  def cases(tag: str, seed: int) -> Iterator[Case]:
    for d in _DEFS:
      if tag not in d.tags:
        continue
      name = _name(d)
      keys = inputs.Keys(seed, kind + name)
      n = d.shape[-1]
      x = inputs.normal(keys.next(), d.shape, d.dtype)
      if d.nonfinite:
        x = _poison_rows(x)
      gamma = inputs.normal(keys.next(), (n,), d.dtype)
      args = [x, gamma]
      if kind == "layer_norm":
        args.append(inputs.normal(keys.next(), (n,), d.dtype))
      if d.residual:
        args.append(inputs.normal(keys.next(), d.shape, d.dtype))
      kwargs = {}
      if d.out_dtype:
        kwargs["out_dtype"] = d.out_dtype
      if d.quantize:
        kwargs["quantize"] = d.quantize
      if d.chunked:
        kwargs["config"] = CHUNKED
        kwargs["backward_config"] = CHUNKED
      # Quantized outputs are not differentiable.
      grad = "grad" in d.tags and not d.quantize
      yield Case(name=name, args=tuple(args), kwargs=kwargs, tags=d.tags,
                 grad_argnums=tuple(range(len(args))) if grad else ())
  return cases


def _drop_kernel_options(kwargs: dict) -> dict:
  return {k: v for k, v in kwargs.items() if k not in ("config", "backward_config")}


def _layer_norm(x, gamma, beta, residual=None, **kwargs):
  return api.layer_norm(x, gamma, beta, residual=residual, **kwargs)


def _rms_norm(x, gamma, residual=None, **kwargs):
  return api.rms_norm(x, gamma, residual=residual, **kwargs)


def _layer_norm_f32(x, gamma, beta, residual=None, **kwargs):
  return reference.layer_norm_f32(x, gamma, beta, residual=residual,
                                  **_drop_kernel_options(kwargs))


def _rms_norm_f32(x, gamma, residual=None, **kwargs):
  return reference.rms_norm_f32(x, gamma, residual=residual,
                                **_drop_kernel_options(kwargs))


def _bytes_moved(kind: str):
  def bytes_moved(case: Case) -> int:
    x = case.args[0]
    n = x.shape[-1]
    rows = x.size // n
    has_residual = len(case.args) == (4 if kind == "layer_norm" else 3)
    total = sum(a.size * a.dtype.itemsize for a in case.args)  # Every input once.
    quantize = case.kwargs.get("quantize")
    if quantize:
      total += x.size * 1 + rows * 4  # 1-byte values, float32 scales.
    else:
      out_dtype = case.kwargs.get("out_dtype") or x.dtype
      total += x.size * jnp.dtype(out_dtype).itemsize
    if has_residual:
      total += x.size * x.dtype.itemsize  # h is written back.
    return int(total)
  return bytes_moved


def _flops(kind: str):
  # Per element: layer norm ~ sub, square, add (stats) + sub, mul, mul, add;
  # RMS norm ~ square, add + mul, mul. Plus the residual add.
  per_element = 7 if kind == "layer_norm" else 4

  def flops(case: Case) -> int:
    x = case.args[0]
    has_residual = len(case.args) == (4 if kind == "layer_norm" else 3)
    return int(x.size * (per_element + has_residual))
  return flops


def _closes(op: str) -> Closes:
  return Closes(
      kinds=frozenset({"separate-reduction", "unfused-prologue"}),
      # Its backward (the custom VJP of a call in the forward) is one pass
      # over dy, gamma's and beta's gradients summed beside dx.
      anchors=frozenset({op, f"{op}_backward"}), epilogues=frozenset({"cast", "quantize"}),
      prologues=frozenset({"residual"}), statistics="last axis",
      keywords=(("residual", "residual"), ("cast", "out_dtype")))


def _make_case(op: str):
  def make_case(*, seed, tags=(), grad=False, rows, cols, dtype="float32", residual=False,
                quantize=None, out_dtype=None) -> Case:
    return row_ops.make_case(op, seed=seed, tags=tags, grad=grad, rows=rows, cols=cols,
                             dtype=dtype, out_dtype=out_dtype, residual=residual,
                             quantize=quantize)
  return make_case


LAYER_NORM_SPEC = OpSpec(
    name="layer_norm", fn=_layer_norm, reference_f32=_layer_norm_f32,
    cases=_cases("layer_norm"), bytes_moved=_bytes_moved("layer_norm"),
    flops=_flops("layer_norm"), api=api.layer_norm, closes=_closes("layer_norm"),
    sweep_params=row_ops.NORM_PARAMS, make_case=_make_case("layer_norm"),
    suggest=functools.partial(row_ops.suggest, "layer_norm"))

RMS_NORM_SPEC = OpSpec(
    name="rms_norm", fn=_rms_norm, reference_f32=_rms_norm_f32,
    cases=_cases("rms_norm"), bytes_moved=_bytes_moved("rms_norm"),
    flops=_flops("rms_norm"), api=api.rms_norm, closes=_closes("rms_norm"),
    sweep_params=row_ops.NORM_PARAMS, make_case=_make_case("rms_norm"),
    suggest=functools.partial(row_ops.suggest, "rms_norm"))

SPECS: tuple[OpSpec, ...] = (LAYER_NORM_SPEC, RMS_NORM_SPEC)
#: The registry's per-module convention is `SPEC`; this folder holds two ops.
SPEC = LAYER_NORM_SPEC
