"""softmax's `SPEC`: cases and cost model for validate and bench, sweep
parameters, and the audit findings it closes (`spec.py`).

In a case, positional args are (x,) or (x, mask), so that the gradient of an
additive mask can be checked too.

Tags: "ci" (small, interpret-friendly: 1 row, prime widths, leading dims, rows
longer than the block, scale, additive/boolean/causal masks, fully masked
rows, f32/bf16/f16), "grad" (gradients checked), "nonfinite" (NaN/+Inf/-Inf
logits), "bench" (attention-score and vocabulary-sized rows).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.softmax import api
from pallas_kernels._src.ops.softmax import reference
from pallas_kernels._src.ops.softmax.config import Config
from pallas_kernels._src.ops import row_ops
from pallas_kernels._src.spec import Case, Closes, OpSpec

#: Forces three column chunks on short rows, to exercise the online path in CI.
CHUNKED = Config(block_rows=2, block_cols=128)


@dataclasses.dataclass(frozen=True, slots=True)
class _Def:
  shape: tuple[int, ...]
  dtype: str
  tags: frozenset[str]
  scale: float | None = None
  #: None, or (mask shape, "bool" | "bool_empty_rows" | "add").
  mask: tuple[tuple[int, ...], str] | None = None
  causal: str | None = None  # None, "top_left" or "bottom_right".
  out_dtype: str | None = None
  chunked: bool = False
  nonfinite: bool = False


def _t(*tags: str) -> frozenset[str]:
  return frozenset(tags)


_DEFS: tuple[_Def, ...] = (
    # Gradients are checked on three ci cases (bf16 causal, additive mask over
    # chunked rows, and the fallback below); the op's tests cover the rest.
    _Def((1, 1), "float32", _t("ci")),
    _Def((7, 129), "float32", _t("ci"), scale=0.125),
    _Def((2, 3, 17, 33), "bfloat16", _t("ci", "grad"), scale=0.5, causal="top_left"),
    _Def((2, 4, 5, 31), "float16", _t("ci"), mask=((5, 31), "bool")),
    _Def((2, 3, 8, 300), "float32", _t("ci", "grad"), mask=((2, 1, 8, 300), "add"),
         chunked=True),
    _Def((2, 5, 9), "float32", _t("ci"), causal="bottom_right",
         mask=((5, 9), "bool_empty_rows")),
    _Def((3, 40), "float32", _t("ci", "grad"), out_dtype="bfloat16"),
    _Def((6, 33), "float32", _t("ci", "nonfinite")),
    _Def((16, 16, 1024, 1024), "bfloat16", _t("bench"), scale=0.125, causal="top_left"),
    _Def((16, 16, 1024, 1024), "bfloat16", _t("bench"), mask=((1024, 1024), "add")),
    _Def((4096, 4096), "bfloat16", _t("bench", "device"), causal="top_left"),
    _Def((8192, 8192), "bfloat16", _t("bench")),
    _Def((4096, 32768), "bfloat16", _t("bench")),
)


def _name(d: _Def) -> str:
  parts = [inputs.describe("x", d.shape, d.dtype)]
  if d.scale is not None:
    parts.append(f"scale={d.scale}")
  if d.mask:
    shape, kind = d.mask
    parts.append(f"{kind}-mask[{','.join(map(str, shape))}]")
  if d.causal:
    parts.append(f"causal={d.causal}")
  if d.out_dtype:
    parts.append(f"->{inputs.short_dtype(d.out_dtype)}")
  if d.chunked:
    parts.append(f"chunk={CHUNKED.block_cols}")
  if d.nonfinite:
    parts.append("nan/inf")
  return " ".join(parts)


def _mask(keys: inputs.Keys, shape: tuple[int, ...], kind: str):
  if kind == "add":
    return inputs.normal(keys.next(), shape, jnp.float32)
  keep = jax.random.bernoulli(keys.next(), 0.75, shape)
  if kind == "bool_empty_rows":
    keep = keep.at[..., 0, :].set(False).at[..., -2, :].set(False)
  return keep


def _poison(x):
  """NaN, +Inf and -Inf into rows 1, 4 and 5 of a 2-D x (one entry each)."""
  x = np.array(x)
  x[1, 3] = np.nan
  x[4, 0] = np.inf
  x[5, -1] = -np.inf
  return jnp.asarray(x)


def _cases(tag: str, seed: int) -> Iterator[Case]:
  for d in _DEFS:
    if tag not in d.tags:
      continue
    name = _name(d)
    keys = inputs.Keys(seed, "softmax" + name)
    x = inputs.normal(keys.next(), d.shape, d.dtype)
    if d.nonfinite:
      x = _poison(x)
    args = [x]
    if d.mask:
      args.append(_mask(keys, *d.mask))
    kwargs = {}
    if d.scale is not None:
      kwargs["scale"] = d.scale
    if d.causal:
      kwargs["causal"] = True
      kwargs["causal_alignment"] = d.causal
    if d.out_dtype:
      kwargs["out_dtype"] = d.out_dtype
    if d.chunked:
      kwargs["config"] = CHUNKED
      kwargs["backward_config"] = CHUNKED
    grad_argnums = ()
    if "grad" in d.tags:
      additive = d.mask is not None and d.mask[1] == "add"
      grad_argnums = (0, 1) if additive else (0,)
    # A narrower output than input: the backward runs the reference by design.
    designed = ("backward: out_dtype" if d.out_dtype and
                jnp.dtype(d.out_dtype).itemsize < jnp.dtype(d.dtype).itemsize else "")
    yield Case(name=name, args=tuple(args), kwargs=kwargs, tags=d.tags,
               grad_argnums=grad_argnums, expect_fallback=designed)


def _softmax(x, mask=None, **kwargs):
  return api.softmax(x, mask=mask, **kwargs)


def _softmax_f32(x, mask=None, **kwargs):
  kwargs = {k: v for k, v in kwargs.items() if k not in ("config", "backward_config")}
  return reference.softmax_f32(x, mask=mask, **kwargs)


def _bytes_moved(case: Case) -> int:
  x = case.args[0]
  out_dtype = case.kwargs.get("out_dtype") or x.dtype
  total = x.size * (x.dtype.itemsize + jnp.dtype(out_dtype).itemsize)
  if len(case.args) > 1:
    mask = case.args[1]
    total += mask.size * mask.dtype.itemsize  # Read once; rows are reused from cache.
  return int(total)


def _flops(case: Case) -> int:
  # Per element: scale, mask, max, subtract, exp (counted as 1), sum, divide.
  return int(case.args[0].size * 7)


def _make_case(*, seed, tags=(), grad=False, rows, cols, dtype="float32", scale=None,
               causal=False, out_dtype=None) -> Case:
  return row_ops.make_case("softmax", seed=seed, tags=tags, grad=grad, rows=rows,
                           cols=cols, dtype=dtype, out_dtype=out_dtype, scale=scale,
                           causal=causal)


CLOSES = Closes(
    kinds=frozenset({"separate-reduction"}), anchors=frozenset({"softmax"}),
    epilogues=frozenset({"cast"}), prologues=frozenset({"scale", "mask"}),
    statistics="last axis",
    keywords=(("scale", "scale"), ("mask", "mask"), ("cast", "out_dtype")),
    declines=types.MappingProxyType({"log_softmax": "returns probabilities, not logs"}))

SPEC = OpSpec(name="softmax", fn=_softmax, reference_f32=_softmax_f32,
              cases=_cases, bytes_moved=_bytes_moved, flops=_flops, api=api.softmax,
              closes=CLOSES, sweep_params=row_ops.SOFTMAX_PARAMS, make_case=_make_case,
              suggest=functools.partial(row_ops.suggest, "softmax"))
