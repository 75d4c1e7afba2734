"""linear_cross_entropy's `SPEC`: cases and cost model for validate and
bench, sweep parameters, and the audit findings it closes (`spec.py`).

In a case, positional args are (x, w, labels) or (x, w, labels, bias), so
that the bias gradient can be checked too.

Tags: "ci" (small, interpret-friendly: ragged tokens and vocabularies, vocab
chunks of 128 over V = 300, f32/bf16/f16, with and without bias,
ignore_index, each reduction), "grad" (gradients of x, w and bias checked),
"nonfinite" (a NaN activation and an out-of-range label), "bench" (LM-head
sizes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.linear_cross_entropy import api
from pallas_kernels._src.ops.linear_cross_entropy import reference
from pallas_kernels._src.ops.linear_cross_entropy.config import Config
from pallas_kernels._src.spec import Call, CallFacts, Case, Closes, OpSpec, SweepParam

#: Vocab chunks of 128 over V = 300: three chunks, the last one ragged; D in
#: steps of 16 (D = 40: three, the last one ragged).
CHUNKED = Config(block_t=16, block_v=128, block_d=16)


@dataclasses.dataclass(frozen=True, slots=True)
class _Def:
  lead: tuple[int, ...]
  d: int
  vocab: int
  dtype: str
  tags: frozenset[str]
  bias: bool = False
  reduction: str = "mean"
  ignore_index: int | None = None
  chunked: bool = False
  nonfinite: bool = False
  #: compute_dtype: f32 operands rounded to it as the kernels load them.
  compute: str | None = None


def _t(*tags: str) -> frozenset[str]:
  return frozenset(tags)


_DEFS: tuple[_Def, ...] = (
    _Def((13,), 40, 300, "float32", _t("ci", "grad"), bias=True, chunked=True),
    _Def((2, 7), 64, 300, "bfloat16", _t("ci", "grad"), reduction="sum",
         ignore_index=-100, chunked=True),
    _Def((5,), 33, 17, "float32", _t("ci"), reduction="none"),
    _Def((37,), 24, 1000, "bfloat16", _t("ci", "grad"), bias=True, ignore_index=0),
    _Def((9,), 16, 130, "float16", _t("ci"), reduction="none", ignore_index=-1,
         chunked=True),
    _Def((6,), 20, 50, "float32", _t("ci", "nonfinite"), reduction="none",
         nonfinite=True),
    # A mixed-precision head: f32 parameters, bf16 products.
    _Def((11,), 24, 200, "float32", _t("ci"), bias=True, reduction="none",
         chunked=True, compute="bfloat16"),
    _Def((8192,), 4096, 32768, "bfloat16", _t("bench")),
    # Timed by scripts/device_check.sh when a GPU is lent (Llama 3's vocabulary).
    _Def((4096,), 2048, 128256, "bfloat16", _t("bench", "device"), ignore_index=-100),
)


def _name(d: _Def) -> str:
  parts = [inputs.describe("x", (*d.lead, d.d), d.dtype),
           inputs.describe("w", (d.d, d.vocab), d.dtype)]
  if d.bias:
    parts.append("+bias")
  parts.append(d.reduction)
  if d.ignore_index is not None:
    parts.append(f"ignore={d.ignore_index}")
  if d.chunked:
    parts.append(f"chunk={CHUNKED.block_v}")
  if d.nonfinite:
    parts.append("nan/bad-label")
  if d.compute:
    parts.append(f"compute={jnp.dtype(d.compute).name}")
  return " ".join(parts)


def _labels(keys: inputs.Keys, lead, vocab: int, ignore_index: int | None):
  labels = jax.random.randint(keys.next(), lead, 0, vocab, jnp.int32)
  if ignore_index is not None:
    drop = jax.random.bernoulli(keys.next(), 0.25, lead)
    labels = jnp.where(drop, ignore_index, labels)
  return labels


def _build(name: str, seed: int, lead, d: int, vocab: int, dtype, bias: bool,
           ignore_index: int | None):
  keys = inputs.Keys(seed, "linear_cross_entropy" + name)
  x = inputs.normal(keys.next(), (*lead, d), dtype)
  # w ~ N(0, 1/D): logits of order one, as a trained head gives.
  w = (inputs.normal(keys.next(), (d, vocab), jnp.float32) / np.sqrt(d)).astype(dtype)
  args = [x, w, _labels(keys, lead, vocab, ignore_index)]
  if bias:
    args.append(inputs.normal(keys.next(), (vocab,), dtype))
  return args


def _poison(args):
  """NaN into token 1's activations, and an out-of-range label for token 4."""
  x, w, labels = args[:3]
  x = jnp.asarray(np.array(x)).at[1, 3].set(jnp.nan)
  labels = labels.at[4].set(w.shape[1])
  return [x, w, labels, *args[3:]]


def _cases(tag: str, seed: int) -> Iterator[Case]:
  for d in _DEFS:
    if tag not in d.tags:
      continue
    name = _name(d)
    args = _build(name, seed, d.lead, d.d, d.vocab, d.dtype, d.bias, d.ignore_index)
    if d.nonfinite:
      args = _poison(args)
    kwargs: dict = {"reduction": d.reduction}
    if d.ignore_index is not None:
      kwargs["ignore_index"] = d.ignore_index
    if d.chunked:
      kwargs["config"] = CHUNKED
    if d.compute:
      kwargs["compute_dtype"] = d.compute
    grad_argnums = ((0, 1, 3) if d.bias else (0, 1)) if "grad" in d.tags else ()
    yield Case(name=name, args=tuple(args), kwargs=kwargs, tags=d.tags,
               grad_argnums=grad_argnums)


def _lce(x, w, labels, bias=None, **kwargs):
  return api.linear_cross_entropy(x, w, labels, bias=bias, **kwargs)


def _lce_f32(x, w, labels, bias=None, **kwargs):
  kwargs = {k: v for k, v in kwargs.items() if k != "config"}
  return reference.linear_cross_entropy_f32(x, w, labels, bias=bias, **kwargs)


def _baseline(x, w, labels, bias=None, **kwargs):
  """What a user writes: the logits in full, then log_softmax and the pick."""
  kwargs = {k: v for k, v in kwargs.items() if k != "config"}
  return reference.linear_cross_entropy(x, w, labels, bias=bias, **kwargs)


def _bytes_moved(case: Case) -> int:
  x, w, labels = case.args[:3]
  total = sum(a.size * a.dtype.itemsize for a in case.args)
  out = labels.size if case.kwargs.get("reduction") == "none" else 1
  return int(total + 4 * out)  # The [T, V] logits are never written.


def _flops(case: Case) -> int:
  x, w = case.args[:2]
  tokens = x.size // x.shape[-1]
  d, vocab = w.shape
  # The projection, then per logit: max, subtract, exp (counted as 1), sum.
  return int(2 * tokens * d * vocab + 4 * tokens * vocab)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("tokens", "int", 1024), SweepParam("d", "int", 1024),
    SweepParam("vocab", "int", 32768), SweepParam("dtype", "dtype", "bfloat16"),
    SweepParam("grad", "bool", False), SweepParam("bias", "bool", False),
    SweepParam("reduction", "str", "mean"),
    SweepParam("ignore_index", "int", None, optional=True))


def _make_case(*, seed, tags=(), grad=False, tokens, d, vocab, dtype="bfloat16",
               bias=False, reduction="mean", ignore_index=None) -> Case:
  name = (f"linear_cross_entropy {inputs.describe('x', (tokens, d), dtype)} "
          f"{inputs.describe('w', (d, vocab), dtype)}")
  args = _build(name, seed, (tokens,), d, vocab, dtype, bias, ignore_index)
  kwargs: dict = {"reduction": reduction}
  if ignore_index is not None:
    kwargs["ignore_index"] = ignore_index
  grad_argnums = ((0, 1, 3) if bias else (0, 1)) if grad else ()
  return Case(name=name, args=tuple(args), kwargs=kwargs, tags=frozenset(tags),
              grad_argnums=grad_argnums)


def suggest(facts: CallFacts) -> Call | None:
  """The fused loss over the projection the audit read: x [..., D] @ w [D, V]
  (a dot contracting x's last and w's first axis, with no batch axes)."""
  mm = facts.matmul
  if mm is None or len(mm.rhs.dims) != 2 or not mm.lhs.dims:
    return None
  if mm.lhs_contracting is not None and (
      tuple(mm.lhs_contracting) != (len(mm.lhs.dims) - 1,)
      or tuple(mm.rhs_contracting) != (0,) or mm.lhs_batch or mm.rhs_batch):
    return None
  lhs, rhs = mm.lhs, mm.rhs
  lead, vocab = tuple(lhs.dims[:-1]), rhs.dims[1]
  arrays = [("x", lhs.dtype, tuple(lhs.dims), True), ("w", rhs.dtype, tuple(rhs.dims), True),
            ("labels", "s32", lead, True)]
  if any(item.partition(":")[0] == "bias" for item in facts.ops):
    arrays.append(("bias", facts.boundary.dtype, (vocab,), False))
  return Call("linear_cross_entropy", tuple(arrays), (), "f32[]")


CLOSES = Closes(
    kinds=frozenset({"separate-reduction", "unfused-epilogue", "unfused-prologue"}),
    anchors=frozenset({"linear_cross_entropy"}),
    epilogues=frozenset({"bias", "cast", "log_softmax", "column_reduction", "reduce"}),
    prologues=frozenset({"cast"}),
    keywords=(("bias", "bias"),),
    outputs=3)

SPEC = OpSpec(name="linear_cross_entropy", fn=_lce, reference_f32=_lce_f32,
              cases=_cases, bytes_moved=_bytes_moved, flops=_flops, baseline=_baseline,
              api=api.linear_cross_entropy, closes=CLOSES, sweep_params=SWEEP_PARAMS,
              make_case=_make_case, suggest=suggest)
