"""linear_cross_entropy: the Pallas kernels in interpret mode against the
float32 reference, its guard, and that no [tokens, V] array ever exists.

Expected values come only from `reference.py`, tolerances only from
`tolerances.py`. Every kernel test fails on any recorded fallback: the kernel
itself must have run.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src import inputs
from pallas_kernels._src.ops.linear_cross_entropy import api, arg_specs, reference
from pallas_kernels._src.ops.linear_cross_entropy import guard
from pallas_kernels._src.ops.linear_cross_entropy.config import Config
from pallas_kernels._src.spec import CallFacts
from pallas_kernels._src.tolerances import relative_error, tolerance

#: Vocab chunks of 128: V = 300 takes three, the last one ragged; D steps of
#: 16: D = 40 takes three, the last one ragged.
CHUNKED = Config(block_t=16, block_v=128, block_d=16)
IGNORE = -100


def lce(*args, **kw):
  kw.setdefault("config", CHUNKED)
  return pk_op(*args, implementation="pallas", interpret=True, **kw)


def pk_op(*args, **kw):
  return api.linear_cross_entropy(*args, **kw)


def ref_f32(x, w, labels, **kw):
  kw.pop("config", None)
  return reference.linear_cross_entropy_f32(x, w, labels, **kw)


def make(lead, d, vocab, dtype, *, bias=False, ignore=False, tag="", ignore_index=IGNORE):
  keys = inputs.Keys(0, f"{lead}{d}{vocab}{dtype}{tag}")
  x = inputs.normal(keys.next(), (*lead, d), dtype)
  w = (inputs.normal(keys.next(), (d, vocab), jnp.float32) / math.sqrt(d)).astype(dtype)
  labels = jax.random.randint(keys.next(), lead, 0, vocab, jnp.int32)
  if ignore:
    labels = jnp.where(jax.random.bernoulli(keys.next(), 0.3, lead), ignore_index, labels)
  b = inputs.normal(keys.next(), (vocab,), dtype) if bias else None
  return x, w, labels, b


def assert_close(out, expected, dtype, *, grad=False):
  assert out.shape == expected.shape
  err = relative_error(out, expected)
  bound = tolerance(dtype, grad=grad)
  assert err <= bound, f"relative error {err:.3e} > {bound:.0e} ({dtype})"


@pytest.fixture(autouse=True)
def no_fallback(clean_fallbacks):
  """Any fallback fails the test: the kernels themselves must have run."""
  yield
  assert not pk.fallbacks(), pk.fallbacks()


@pytest.mark.parametrize("lead,dtype,bias,reduction,ignore", [
    ((13,), "float32", True, "none", False),    # Ragged tokens and vocab chunks.
    ((13,), "float32", False, "sum", True),
    ((2, 7), "bfloat16", True, "mean", True),   # Leading dims, ignored tokens.
    ((2, 7), "float16", False, "none", True),
])
def test_forward_matches_reference(lead, dtype, bias, reduction, ignore):
  x, w, labels, b = make(lead, 40, 300, dtype, bias=bias, ignore=ignore)
  kw = dict(bias=b, reduction=reduction, ignore_index=IGNORE if ignore else None)
  out = lce(x, w, labels, **kw)
  assert out.dtype == jnp.float32
  assert out.shape == (lead if reduction == "none" else ())
  # The losses are float32 from exact products: the f32 bound, whatever x is.
  assert_close(out, ref_f32(x, w, labels, **kw), "float32")


def test_heuristic_tiling_over_several_token_blocks():
  # 37 tokens in blocks of 16 and V = 1000 in chunks of 128 (heuristic here).
  x, w, labels, b = make((37,), 24, 1000, "float32", bias=True)
  cfg = Config(block_t=16, block_v=128)
  out = lce(x, w, labels, bias=b, reduction="none", config=cfg)
  assert_close(out, ref_f32(x, w, labels, bias=b, reduction="none"), "float32")
  assert_close(lce(x, w, labels, bias=b, config=None),
               ref_f32(x, w, labels, bias=b), "float32")


# An ignore_index inside [0, V) (a padding token) must be ignored by the
# backward as such, not merely as an out-of-range label.
@pytest.mark.parametrize("dtype,reduction,ignore_index", [
    ("float32", "mean", IGNORE), ("bfloat16", "sum", 0), ("float32", "none", 7)])
def test_gradients_of_x_w_and_bias(dtype, reduction, ignore_index):
  x, w, labels, b = make((13,), 40, 300, dtype, bias=True, ignore=True,
                         ignore_index=ignore_index)
  kw = dict(reduction=reduction, ignore_index=ignore_index)
  ct = inputs.normal(jax.random.key(5), labels.shape if reduction == "none" else (),
                     jnp.float32)

  def grads(fn, *args):
    out, pullback = jax.vjp(lambda x, w, b: fn(x, w, labels, bias=b, **kw), *args)
    return pullback(ct)

  got = jax.jit(lambda *a: grads(lce, *a))(x, w, b)
  f32 = [a.astype(jnp.float32) for a in (x, w, b)]
  want = grads(ref_f32, *f32)
  for g, r, p in zip(got, want, (x, w, b)):
    assert g.dtype == p.dtype and g.shape == p.shape
    assert_close(g, r, dtype, grad=True)


@pytest.mark.parametrize("implementation", ["pallas", "xla"])
def test_compute_dtype_rounds_f32_operands_as_they_load(implementation):
  # f32 parameters multiplied in bf16: the loss is the rounded operands'
  # (without the rounding it moves by ~1e-4), the gradients stay f32.
  x, w, labels, b = make((13,), 40, 300, "float32", bias=True)
  kw = dict(bias=b, reduction="none")
  run = lce if implementation == "pallas" else (
      lambda *a, **k: pk_op(*a, implementation="xla", **k))
  got = run(x, w, labels, compute_dtype=jnp.bfloat16, **kw)
  bf16 = [a.astype(jnp.bfloat16) for a in (x, w)]
  rounded = ref_f32(*bf16, labels, **kw)
  np.testing.assert_allclose(got, rounded, rtol=2e-6, atol=2e-6)
  assert relative_error(ref_f32(x, w, labels, **kw), rounded) > 1e-5
  grads = jax.grad(lambda x, w: run(x, w, labels, compute_dtype="bfloat16",
                                    **kw).sum(), (0, 1))(x, w)
  want = jax.grad(lambda x, w: ref_f32(x, w, labels, **kw).sum(), (0, 1))(x, w)
  for g, r in zip(grads, want):
    assert g.dtype == jnp.float32
    assert_close(g, r, "bfloat16", grad=True)


def test_compute_dtype_must_be_a_float_the_kernels_take():
  x, w, labels, _ = make((13,), 40, 300, "float32")
  with pytest.raises(ValueError, match="compute_dtype must be a floating dtype"):
    pk_op(x, w, labels, compute_dtype=jnp.int8)
  assert "compute dtype float64" in guard.unsupported_reason(
      **dict(_OK, compute_dtype=jnp.float64))


def test_ignored_tokens_have_zero_loss_zero_gradient_and_leave_the_mean():
  x, w, labels, _ = make((13,), 40, 300, "float32", ignore=True)
  ignored = np.asarray(labels == IGNORE)
  assert 0 < ignored.sum() < 13
  losses = lce(x, w, labels, reduction="none", ignore_index=IGNORE)
  assert np.all(np.asarray(losses)[ignored] == 0)
  mean = lce(x, w, labels, ignore_index=IGNORE)
  np.testing.assert_allclose(mean, np.asarray(losses).sum() / (~ignored).sum(), rtol=1e-6)
  dx = jax.grad(lambda x: lce(x, w, labels, ignore_index=IGNORE))(x)
  assert np.all(np.asarray(dx)[ignored] == 0)
  assert np.all(np.asarray(dx)[~ignored] != 0)


def test_all_ignored_gives_a_nan_mean_and_finite_zero_gradients():
  x, w, labels, _ = make((5,), 16, 40, "float32")
  labels = jnp.full_like(labels, IGNORE)
  assert np.isnan(lce(x, w, labels, ignore_index=IGNORE))
  assert np.isnan(ref_f32(x, w, labels, ignore_index=IGNORE))
  dw = jax.grad(lambda w: lce(x, w, labels, ignore_index=IGNORE))(w)
  assert np.all(np.asarray(dw) == 0)


def test_out_of_range_label_gives_nan_for_that_token_only():
  x, w, labels, _ = make((6,), 16, 40, "float32")
  labels = labels.at[2].set(40)
  out = np.asarray(lce(x, w, labels, reduction="none"))
  assert np.isnan(out[2]) and np.isfinite(np.delete(out, 2)).all()
  assert_close(jnp.asarray(out), ref_f32(x, w, labels, reduction="none"), "float32")


def test_guard_falls_back_on_an_unsupported_dtype_and_names_it():
  x, w, labels, _ = make((13,), 40, 300, "float32")
  x8 = x.astype(jnp.float8_e4m3fn)
  out = pk_op(x8, w, labels, implementation="pallas", interpret=True)
  (f,) = pk.fallbacks("linear_cross_entropy")
  assert "x dtype float8_e4m3fn" in f.reason and "[13,40]" in f.reason, f.reason
  assert_close(out, ref_f32(x8, w, labels), "float32")
  pk.clear_fallbacks()  # This one was the point of the test.


_OK = dict(x_shape=(8, 16), x_dtype=jnp.float16, w_shape=(16, 64), w_dtype=jnp.bfloat16,
           bias_dtype=jnp.bfloat16, labels_dtype=jnp.int8, interpret=True)


@pytest.mark.parametrize("kw,words", [
    (dict(labels_dtype=jnp.float32), ("labels dtype float32", "[8]")),
    (dict(w_dtype=jnp.int8), ("w dtype int8", "[16,64]")),
    (dict(bias_dtype=jnp.float64), ("bias dtype float64", "[64]")),
    (dict(w_shape=(16, 2**27)), ("[16,134217728]", "int32 offsets")),
    (dict(x_shape=(0, 16)), ("no rows", "[0,16]")),
])
def test_guard_reasons_name_the_shape(kw, words):
  assert guard.unsupported_reason(**_OK) is None
  reason = guard.unsupported_reason(**dict(_OK, **kw))
  assert reason and all(w in reason for w in words), reason


def test_check_guard_answers_without_running():
  S = jax.ShapeDtypeStruct
  ok = pk.check_guard("linear_cross_entropy", S((8, 64), "bfloat16"),
                      S((64, 512), "bfloat16"), S((8,), "int32"), interpret=True)
  assert ok.runs, ok.reason
  # D is walked in chunks: no width is out of reach.
  wide = pk.check_guard("linear_cross_entropy", S((8, 9000), "bfloat16"),
                        S((9000, 512), "bfloat16"), S((8,), "int32"), interpret=True)
  assert wide.runs, wide.reason


def test_guard_names_the_shared_memory_a_config_needs_on_a_gpu():
  S = jax.ShapeDtypeStruct
  args = (S((8192, 4096), "float32"), S((4096, 32768), "float32"), S((8192,), "int32"))
  fits = pk.check_guard("linear_cross_entropy", *args, target="h200", interpret=False)
  assert fits.runs, fits.reason
  big = Config(block_t=128, block_v=256, block_d=128, num_stages=3)
  over = pk.check_guard("linear_cross_entropy", *args, target="h200", interpret=False,
                        config=big)
  assert not over.runs
  assert all(w in over.reason for w in ("KiB of shared memory", "227 KiB", "sm_90",
                                        "[8192,4096]")), over.reason


@pytest.mark.parametrize("cc, kib", [(90, 227), (75, 64), (61, 48)])
def test_the_guard_holds_a_config_to_the_shared_memory_of_the_gpus_capability(
    monkeypatch, cc, kib):
  # The same table as the matmul's (one place): an older or unknown GPU's
  # smaller blocks refuse a config an H200 takes. The guard itself is asked
  # (check_guard keys its answers by target, which names no such GPU).
  from pallas_kernels._src import backend, gpu  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.ops.linear_cross_entropy import config as config_lib  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.ops.linear_cross_entropy import guard  # pylint: disable=import-outside-toplevel
  cfg = Config(block_t=64, block_v=128, block_d=64, num_stages=1)
  need = config_lib.shared_memory(cfg, 4096, 2)
  assert need == 64 * 1024  # a T4's whole block: fits there, exactly
  monkeypatch.setattr(gpu, "compute_capability", lambda: cc)
  with backend.targeting(backend.resolve_target("h200")):
    reason = guard.unsupported_reason(
        x_shape=(8192, 4096), x_dtype=jnp.bfloat16, w_shape=(4096, 32768),
        w_dtype=jnp.bfloat16, bias_dtype=None, labels_dtype=jnp.int32, interpret=False,
        config=cfg)
  if need <= kib * 1024:
    assert reason is None, reason
  else:
    assert f"64 KiB of shared memory per block, over the {kib} KiB a block may use on " \
        f"sm_{cc}" in reason, reason


@pytest.mark.parametrize("kw,match", [
    (dict(labels=np.zeros((12,), np.int32)), r"labels.shape \(12,\)"),
    (dict(labels=np.zeros((13,), np.float32)), "labels must be integers"),
    (dict(bias=np.zeros((299,), np.float32)), r"bias.shape \(299,\)"),
    (dict(reduction="avg"), "reduction must be one of"),
    (dict(ignore_index=1.5), "ignore_index must be a Python int"),
    (dict(w=np.zeros((41, 300), np.float32)), r"w must be \[D, V\].*\(41, 300\)"),
])
def test_bad_arguments_raise_naming_the_shape(kw, match):
  x, w, labels, _ = make((13,), 40, 300, "float32")
  args = dict(w=w, labels=labels)
  args.update((k, kw.pop(k)) for k in list(kw) if k in args)
  with pytest.raises(ValueError, match=match):
    pk_op(x, args["w"], args["labels"], implementation="pallas", interpret=True, **kw)


# ----------------------------------------------------------------------------
# Nothing [tokens, V] is ever materialized.
# ----------------------------------------------------------------------------

T, D, V = 50, 16, 300  # T * V exceeds every legitimate buffer (x, w, padded w).


def _avals(jaxpr):
  """(shape, primitive) of every value a jaxpr and its sub-jaxprs produce."""
  out = [(tuple(v.aval.shape), "input") for v in jaxpr.invars
         if hasattr(v.aval, "shape")]
  for eqn in jaxpr.eqns:
    out += [(tuple(v.aval.shape), eqn.primitive.name) for v in eqn.outvars
            if hasattr(v.aval, "shape")]
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      out += _avals(sub)
  return out


def _largest(fn, *args) -> tuple[int, tuple[int, ...]]:
  avals = _avals(jax.make_jaxpr(fn)(*args).jaxpr)
  return max((math.prod(s), s) for s, _ in avals)


@pytest.mark.parametrize("implementation", ["pallas", "xla"])
def test_no_tokens_by_vocab_array_forward_or_backward(implementation):
  x, w, labels, b = make((T,), D, V, "bfloat16", bias=True)

  def loss(x, w, b):
    return pk_op(x, w, labels, bias=b, implementation=implementation,
                 interpret=True, config=CHUNKED)

  fwd = _largest(loss, x, w, b)
  bwd = _largest(jax.grad(loss, (0, 1, 2)), x, w, b)
  if implementation == "xla":
    # The check can see a [T, V] logits array when there is one.
    assert fwd[0] >= T * V and bwd[0] >= T * V
  else:
    assert fwd[0] < T * V, fwd
    assert bwd[0] < T * V, bwd


def test_lowered_program_holds_no_tokens_by_vocab_buffer():
  # Interpret mode pads operands by a block (w [16, 300] becomes [32, 512]),
  # so sizes say little here; with D < T no buffer may span two axes >= T.
  x, w, labels, b = make((T,), D, V, "float32", bias=True)
  text = jax.jit(jax.grad(lambda x, w, b: lce(x, w, labels, bias=b), (0, 1, 2))).lower(
      x, w, b).as_text()
  shapes = {tuple(int(n) for n in dims.split("x")[:-1])
            for dims in re.findall(r"tensor<((?:\d+x)+)\w+>", text)}
  assert any(T in s for s in shapes) and any(V in s for s in shapes)
  wide = [s for s in shapes if sum(n >= T for n in s) >= 2]
  assert not wide, wide


def test_every_kernel_carries_the_named_scope():
  x, w, labels, b = make((13,), 40, 300, "float32", bias=True)
  scopes = []

  def collect(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "pallas_call":
        scopes.append(str(eqn.source_info.name_stack))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        collect(sub)

  collect(jax.make_jaxpr(jax.grad(lambda x: lce(x, w, labels, bias=b)))(x).jaxpr)
  assert len(scopes) == 2, scopes  # forward, backward
  assert all("pallas_kernels.linear_cross_entropy" in s for s in scopes), scopes


# ----------------------------------------------------------------------------
# The spec: validation, suggestions.
# ----------------------------------------------------------------------------


def test_validate_ci_cases_with_kernels_required():
  report = pk.validate("linear_cross_entropy", tags=("ci",), require_kernel=True,
                       interpret=True)
  assert report.passed, str(report)
  assert any(r.grad_err is not None for r in report.rows)


class _Array:
  def __init__(self, dtype, dims):
    self.dtype, self.dims = dtype, dims


class _Anchor:
  def __init__(self, lhs, rhs, lhs_c=(1,), rhs_c=(0,)):
    self.lhs, self.rhs = lhs, rhs
    self.result = (*lhs.dims[:-1], rhs.dims[-1])
    self.lhs_contracting, self.rhs_contracting = lhs_c, rhs_c
    self.lhs_batch = self.rhs_batch = ()


def _facts(anchor, ops=("bias", "cast:f32", "log_softmax")):
  return CallFacts(kind="separate-reduction", ops=ops, boundary=_Array("f32", (8, 512)),
                   shape="f32[8,512]", matmul=anchor)


def test_suggest_writes_the_call_from_the_projection():
  call = arg_specs.suggest(_facts(_Anchor(_Array("bf16", (8, 64)), _Array("bf16", (64, 512)))))
  assert call.text() == ("pallas_kernels.linear_cross_entropy(x, w, labels, bias=bias)  "
                         "# x: bf16[8,64], w: bf16[64,512], labels: s32[8], "
                         "bias: f32[512] -> f32[]")
  no_bias = arg_specs.suggest(_facts(_Anchor(_Array("f32", (8, 64)), _Array("f32", (64, 512))),
                                     ops=("log_softmax",)))
  assert "bias" not in no_bias.text()
  # A transposed head (x @ E^T) is not [D, V]; nothing to write.
  assert arg_specs.suggest(_facts(_Anchor(_Array("f32", (8, 64)), _Array("f32", (512, 64)),
                                          rhs_c=(1,)))) is None
  assert arg_specs.suggest(_facts(None)) is None
