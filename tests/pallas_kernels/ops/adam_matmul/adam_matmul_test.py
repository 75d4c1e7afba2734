"""adam_matmul: the Pallas kernel in interpret mode against the float32 ground truth.

Expected values come only from `reference.py` (float32 at Precision.HIGHEST),
tolerances only from `tolerances.py`; the reference itself is held against
optax's `adamw` where optax is installed. Every kernel test fails on any
recorded fallback: a passing number computed by XLA would say nothing about
the kernel.
"""

from __future__ import annotations

import re
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from hlo_audit import FindingKind
from hlo_audit import plugins
from pallas_kernels._src import backend
from pallas_kernels._src import inputs
from pallas_kernels._src import registry
from pallas_kernels._src.audit import library
from pallas_kernels._src.ops.adam_matmul import arg_specs
from pallas_kernels._src.ops.adam_matmul import config as config_lib
from pallas_kernels._src.ops.adam_matmul import guard
from pallas_kernels._src.ops.adam_matmul import reference
from pallas_kernels._src.ops.adam_matmul.api import adam_matmul
from pallas_kernels._src.ops.adam_matmul.config import Config
from pallas_kernels._src.spec import CallFacts
from pallas_kernels._src.tolerances import relative_error, tolerance

#: Ragged against every block: M=70 = 2 * 32 + 6, K=77 = 2 * 32 + 13, N=300 = 4 * 64 + 44.
RAGGED = (70, 77, 300)
SMALL = arg_specs.SMALL
LR = 1e-2


def operands(m, k, n, dtype="float32", state="float32", *, transpose_x=True, tag=""):
  keys = inputs.Keys(0, f"adam{m},{k},{n}{dtype}{state}{transpose_x}{tag}")
  x = inputs.normal(keys.next(), (m, k) if transpose_x else (k, m), dtype)
  dy = inputs.normal(keys.next(), (m, n), dtype)
  param = inputs.normal(keys.next(), (k, n), state)
  mu = (0.1 * inputs.normal(keys.next(), (k, n), jnp.float32)).astype(state)
  nu = (0.01 * jnp.abs(inputs.normal(keys.next(), (k, n), jnp.float32))).astype(state)
  return x, dy, param, mu, nu


def kernel(*args, count=0, **kw):
  kw.setdefault("learning_rate", LR)
  return adam_matmul(*args, jnp.int32(count), implementation="pallas", interpret=True, **kw)


def truth(*args, count=0, **kw):
  kw.setdefault("learning_rate", LR)
  return reference.adam_matmul_f32(*args, jnp.int32(count), **kw)


def assert_close(outs, expected):
  for name, out, ref in zip(("param", "mu", "nu"), outs, expected):
    assert out.shape == ref.shape, (name, out.shape, ref.shape)
    err, bound = relative_error(out, ref), tolerance(out.dtype)
    assert err <= bound, f"{name}: relative error {err:.3e} > {bound:.0e}"


def assert_no_fallback():
  assert not pk.fallbacks(), f"the kernel fell back to XLA: {pk.fallbacks()}"


# ----------------------------------------------------------- kernel ----


@pytest.mark.parametrize("count", [0, 7])
def test_ragged_edges_and_bias_correction(clean_fallbacks, count):
  args = operands(*RAGGED)
  out = kernel(*args, count=count, config=SMALL)
  assert [o.dtype for o in out] == [jnp.float32] * 3
  assert_close(out, truth(*args, count=count))
  assert_no_fallback()


def test_bias_correction_uses_the_incremented_count(clean_fallbacks):
  # At count 0 mu_hat = mu' / (1 - b1): the first step's corrections differ
  # most from the next step's; both must match their own ground truth only.
  args = operands(*RAGGED, tag="count")
  first, second = (kernel(*args, count=c, config=SMALL) for c in (0, 1))
  assert relative_error(first[0], second[0]) > 10 * tolerance(jnp.float32)
  assert_close(second, truth(*args, count=1))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_gradient_operands_with_f32_state(clean_fallbacks, dtype):
  args = operands(45, 33, 70, dtype)
  out = kernel(*args, count=7, config=SMALL)
  assert [o.dtype for o in out] == [jnp.float32] * 3
  assert_close(out, truth(*args, count=7))
  assert_no_fallback()


def test_bf16_state_keeps_its_dtype(clean_fallbacks):
  args = operands(37, 19, 48, "bfloat16", "bfloat16")
  out = kernel(*args, count=3, weight_decay=1e-2)
  assert [o.dtype for o in out] == [jnp.bfloat16] * 3
  assert_close(out, truth(*args, count=3, weight_decay=1e-2))
  assert_no_fallback()


def test_weight_decay(clean_fallbacks):
  args = operands(*RAGGED, tag="wd")
  out = kernel(*args, count=2, weight_decay=0.1, config=SMALL)
  assert_close(out, truth(*args, count=2, weight_decay=0.1))
  # The decay shows at the tolerance: lr * wd * param is 1e-3 of param.
  plain = truth(*args, count=2)
  assert relative_error(out[0], plain[0]) > 10 * tolerance(jnp.float32)
  assert_no_fallback()


def test_eps_root_and_an_array_learning_rate(clean_fallbacks):
  # Small gradients into a fresh state: nu_hat = g**2 ~ 3e-3, which
  # eps_root = 1e-3 visibly shifts.
  x, dy, param, _, _ = operands(29, 40, 24, tag="eps_root")
  zeros = jnp.zeros_like(param)
  args = (x * 1e-2, dy, param, zeros, zeros)
  lr = jnp.asarray(3e-2, jnp.float32)
  out = kernel(*args, count=4, eps_root=1e-3, eps=1e-6, learning_rate=lr)
  assert_close(out, truth(*args, count=4, eps_root=1e-3, eps=1e-6, learning_rate=lr))
  assert relative_error(out[0], truth(*args, count=4, eps=1e-6, learning_rate=lr)[0]) > \
      10 * tolerance(jnp.float32)
  assert_no_fallback()


def test_fresh_state_and_x_stored_k_by_m(clean_fallbacks):
  x, dy, param, _, _ = operands(41, 23, 36, transpose_x=False)
  zeros = jnp.zeros_like(param)
  out = kernel(x, dy, param, zeros, zeros, transpose_x=False)
  assert_close(out, truth(x, dy, param, zeros, zeros, transpose_x=False))
  assert_no_fallback()


def test_default_tiling_and_jit(clean_fallbacks):
  args = operands(130, 65, 200, tag="jit")
  step = jax.jit(lambda *a: kernel(*a[:5], count=a[5]))
  for count in (0, 5):  # a traced count: one trace for every step
    assert_close(step(*args, jnp.int32(count)), truth(*args, count=count))
  assert_no_fallback()


def test_state_updates_in_place_only_when_donated(clean_fallbacks):
  args = operands(40, 24, 72, tag="donate")
  kept = [np.asarray(a) for a in args]
  expected = truth(*args, count=1)
  assert_close(kernel(*args, count=1), expected)
  for a, b in zip(args, kept):  # not donated: the inputs are intact
    np.testing.assert_array_equal(np.asarray(a), b)
  step = jax.jit(lambda *a: kernel(*a, count=1), donate_argnums=(2, 3, 4))
  copies = [jnp.array(a, copy=True) for a in args]
  assert_close(step(*copies), expected)
  assert_no_fallback()


def test_no_derivative():
  args = operands(8, 4, 6, tag="grad")
  with pytest.raises(TypeError, match="optimizer step"):
    jax.grad(lambda x: jnp.sum(kernel(x, *args[1:])[0]))(args[0])


# ------------------------------------------------------------ optax ----


@pytest.mark.parametrize("count,weight_decay,eps_root", [(0, 0.0, 0.0), (7, 1e-2, 1e-8)])
def test_the_reference_is_optax_adamw(count, weight_decay, eps_root):
  optax = pytest.importorskip("optax")
  x, dy, param, mu, nu = operands(33, 17, 29, tag="optax")
  g = jnp.dot(x.T, dy, precision=jax.lax.Precision.HIGHEST)
  opt = optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, eps_root=eps_root,
                    weight_decay=weight_decay)
  state = opt.init(param)
  state = (state[0]._replace(count=jnp.int32(count), mu=mu, nu=nu),) + tuple(state[1:])
  updates, new_state = opt.update(g, state, param)
  want = (optax.apply_updates(param, updates), new_state[0].mu, new_state[0].nu)
  got = reference.adam_matmul(x, dy, param, mu, nu, jnp.int32(count), learning_rate=LR,
                              weight_decay=weight_decay, eps_root=eps_root,
                              precision=jax.lax.Precision.HIGHEST)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  assert int(new_state[0].count) == count + 1


# ------------------------------------------------------------- guard ----


def _struct(shape, dtype):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def test_guard_reasons_name_the_shape_or_dtype():
  cfg = Config()
  x, dy, w = _struct((8, 4), "float32"), _struct((8, 6), "float32"), _struct((4, 6), "float32")

  def reason(**kw):
    a = dict(x=x, dy=dy, param=w, mu=w, nu=w) | kw
    return guard.unsupported_reason(a["x"], a["dy"], a["param"], a["mu"], a["nu"],
                                    transpose_x=True, interpret=True, config=cfg)

  assert reason() is None
  assert "x int8[8, 4]" in reason(x=_struct((8, 4), "int8"))
  assert "mismatched dtypes" in reason(dy=_struct((8, 6), "bfloat16"))
  assert "nu int8[4, 6]: dtype int8" in reason(nu=_struct((4, 6), "int8"))
  mixed = reason(param=_struct((4, 6), "bfloat16"))
  assert "mixed state dtypes" in mixed and "param bfloat16[4, 6]" in mixed
  assert "M=0" in reason(x=_struct((0, 4), "float32"), dy=_struct((0, 6), "float32"))
  big = reason(x=_struct((2**20, 2**12), "bfloat16"), dy=_struct((2**20, 6), "bfloat16"))
  assert "x has 4294967296 > 2**31-1 elements" in big
  # The parameter is [K, N]: counted as K * N, whatever K * K is.
  tall = _struct((2**16, 6), "float32")
  assert reason(x=_struct((8, 2**16), "float32"), param=tall, mu=tall, nu=tall) is None
  wide = _struct((2**20, 2**12), "float32")
  assert "param has 4294967296 > 2**31-1 elements" in reason(
      x=_struct((8, 2**20), "float32"), dy=_struct((8, 2**12), "float32"),
      param=wide, mu=wide, nu=wide)


def test_a_fallback_runs_the_reference_and_is_recorded(clean_fallbacks):
  x, dy, param, mu, nu = operands(12, 5, 7, tag="fallback")
  out = kernel(x, dy, param.astype(jnp.bfloat16), mu, nu, count=2)
  (f,) = pk.fallbacks("adam_matmul")
  assert "mixed state dtypes" in f.reason and "param=bfloat16[5,7]" in f.signature
  assert out[0].dtype == jnp.bfloat16 and out[1].dtype == jnp.float32
  expected = truth(x, dy, param.astype(jnp.bfloat16), mu, nu, count=2)
  assert relative_error(out[1], expected[1]) <= tolerance(jnp.float32)


def test_gpu_guard_checks_triton_tiles_and_shared_memory():
  x, dy = _struct((4096, 1024), "bfloat16"), _struct((4096, 1024), "bfloat16")
  w = _struct((1024, 1024), "float32")
  with backend.targeting(backend.DEFAULT_GPU):
    cfg = config_lib.choose_config(4096, 1024, 1024, jnp.bfloat16, interpret=False)
    assert min(cfg.block_k, cfg.block_n, cfg.block_m) >= config_lib.GPU_MIN_BLOCK
    assert cfg.block_k * cfg.block_n <= 64 * 128
    # The largest tile the update's four f32 accumulators allow takes 8
    # warps; a smaller one (a narrow weight) 4.
    assert (cfg.block_k * cfg.block_n, cfg.num_warps) == (64 * 128, 8), cfg
    narrow = config_lib.heuristic_config(4096, 1024, 32, jnp.bfloat16, backend.Backend.GPU)
    assert narrow.block_k * narrow.block_n < 64 * 128 and narrow.num_warps == 4, narrow
    if guard.gpu.unavailable_reason(False) is None:
      assert guard.unsupported_reason(x, dy, w, w, w, transpose_x=True, interpret=False,
                                      config=cfg) is None
      assert "tiles >= 16" in guard.unsupported_reason(
          x, dy, w, w, w, transpose_x=True, interpret=False,
          config=Config(block_k=8, block_n=64, block_m=64))


@pytest.mark.parametrize("change,match", [
    (dict(dy_shape=(9, 6)), "has M=8 but dy"),
    (dict(nu_shape=(6, 4)), r"nu must have the gradient's shape \[K, N\]=\[4, 6\]"),
    (dict(count=jnp.zeros((1,), jnp.int32)), "count must be an integer scalar"),
    (dict(count=jnp.float32(0)), "count must be an integer scalar"),
    (dict(learning_rate=jnp.ones((2,))), "learning_rate must be"),
    (dict(b1=jnp.float32(0.9)), "b1 must be a Python float"),
    (dict(implementation="triton"), "implementation must be"),
    (dict(config=object()), "config must be"),
])
def test_invalid_calls_raise(change, match):
  x, dy, w = jnp.ones((8, 4)), jnp.ones(change.get("dy_shape", (8, 6))), jnp.ones((4, 6))
  nu = jnp.ones(change.get("nu_shape", (4, 6)))
  with pytest.raises(ValueError, match=match):
    adam_matmul(x, dy, w, w, nu, change.get("count", jnp.int32(0)),
                learning_rate=change.get("learning_rate", 1e-3), b1=change.get("b1", 0.9),
                implementation=change.get("implementation", "pallas"), interpret=True,
                config=change.get("config"))


# --------------------------------------------------------- the spec ----


@pytest.mark.parametrize("in_place, aliases", [(True, {2: 0, 3: 1, 4: 2}), (False, {})])
def test_the_state_is_written_in_place_only_when_asked(in_place, aliases):
  # Aliased, a step that donates its state updates it where it lies; one
  # that does not would have XLA copy param, mu and nu first.
  args = operands(*RAGGED)
  jaxpr = jax.make_jaxpr(lambda *a: kernel(*a, in_place=in_place, config=SMALL))(*args)
  (call,) = [e for e in _inner(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
  assert dict(call.params["input_output_aliases"]) == aliases


def _inner(jaxpr):
  for e in jaxpr.eqns:
    yield e
    for p in e.params.values():
      inner = getattr(p, "jaxpr", p)
      if hasattr(inner, "eqns"):
        yield from _inner(inner)


def test_validate_ci_with_kernels_required(clean_fallbacks):
  report = pk.validate("adam_matmul", tags=("ci",), interpret=True, require_kernel=True)
  assert report.passed, str(report)
  defs = [c for c in arg_specs.CASE_DEFS if "ci" in c.tags]
  assert {c.count for c in defs} >= {0, 7}
  assert any(c.weight_decay for c in defs) and any(c.dtype == "bfloat16" for c in defs)


def test_cost_model_and_baseline_of_the_bench_case():
  d = next(c for c in arg_specs.CASE_DEFS if "bench" in c.tags)
  case = jax.eval_shape(lambda: arg_specs.build_case(d, 0).args)
  fake = types.SimpleNamespace(args=case, kwargs={})
  m, k, n = 4096, 1024, 1024
  assert arg_specs.flops(fake) == 2 * m * k * n
  assert arg_specs.bytes_moved(fake) == 4 * (m * k + m * n) + 2 * 3 * 4 * k * n
  # The baseline writes the gradient and runs the update apart: a dot, then
  # elementwise work, in the jnp a user writes.
  jaxpr = str(jax.make_jaxpr(lambda *a: arg_specs.xla_baseline(*a, learning_rate=LR))(*case))
  assert "dot_general" in jaxpr and "sqrt" in jaxpr and "pallas_call" not in jaxpr


def test_sweep_case_has_the_grid_shapes():
  case = arg_specs.make_case(seed=0, m=9, k=5, n=7, dtype="bfloat16", count=3)
  assert [a.shape for a in case.args] == [(9, 5), (9, 7), (5, 7), (5, 7), (5, 7), ()]
  assert case.args[0].dtype == jnp.bfloat16 and int(case.args[5]) == 3


# ---------------------------------------------------- the audit's call ----


def _array(dt, dims):
  return types.SimpleNamespace(dtype=dt, dims=tuple(dims))


def _facts(ops=("outputs:3", "adam"), lhs=(512, 64), rhs=(512, 96), boundary=(64, 96),
           contracting=((0,), (0,)), batch=((), ()), dtype="f32", result=None):
  anchor = types.SimpleNamespace(
      lhs=_array(dtype, lhs), rhs=_array(dtype, rhs),
      result=tuple(boundary) if result is None else result,
      lhs_contracting=contracting[0], rhs_contracting=contracting[1],
      lhs_batch=batch[0], rhs_batch=batch[1])
  return CallFacts(kind="unfused-epilogue", ops=tuple(ops), boundary=_array(dtype, boundary),
                   shape=f"{dtype}[{','.join(map(str, boundary))}]", matmul=anchor,
                   numpy_name=plugins.numpy_dtype_name)


def test_suggest_writes_the_weight_gradient_step():
  call = arg_specs.suggest(_facts())
  assert call.text() == (
      "pallas_kernels.adam_matmul(x, dy, param, mu, nu, count, "
      "learning_rate=learning_rate)  # x: f32[512,64], dy: f32[512,96], "
      "param: f32[64,96], mu: f32[64,96], nu: f32[64,96], count: s32[] "
      "-> (f32[64,96], f32[64,96], f32[64,96])")


def test_suggest_for_a_bf16_gradient_cast_to_f32_and_a_library_call():
  facts = _facts(ops=("outputs:3", "cast:f32", "adam"), dtype="bf16",
                 contracting=(None, None), result=())
  call = arg_specs.suggest(facts)
  assert [(n, dt, dims) for n, dt, dims, _ in call.arrays] == [
      ("x", "bf16", (512, 64)), ("dy", "bf16", (512, 96)), ("param", "f32", (64, 96)),
      ("mu", "f32", (64, 96)), ("nu", "f32", (64, 96)), ("count", "s32", ())]


def test_suggest_reads_x_stored_k_by_m_and_a_transposed_store():
  # The gemm reads x^T as stored, [K, M], and contracts its last axis.
  call = arg_specs.suggest(_facts(contracting=((1,), (0,)), lhs=(64, 512), rhs=(512, 96)))
  assert ("transpose_x", "False", False) in call.options
  assert [dims for _, _, dims, _ in call.arrays][:3] == [(64, 512), (512, 96), (64, 96)]
  # A weight kept [out, in]: the gemm computes [in, out] and stores it
  # transposed, so the gradient is dy^T @ x: the operands swap.
  call = arg_specs.suggest(_facts(lhs=(512, 64), rhs=(512, 96), boundary=(96, 64),
                                  result=(64, 96)))
  assert [dims for _, _, dims, _ in call.arrays][:3] == [(512, 96), (512, 64), (96, 64)]
  assert "transpose_x" not in call.text()


@pytest.mark.parametrize("kw", [
    dict(contracting=((0,), (1,)), lhs=(512, 64), rhs=(96, 512)),   # dy stored [N, M]
    dict(batch=((0,), (0,)), lhs=(2, 512, 64), rhs=(2, 512, 96)),   # batched
    dict(lhs=(512, 64), rhs=(256, 96)),                             # M differs
    dict(boundary=(96, 64)),                                        # not the gemm's result
    dict(ops=("outputs:3", "elementwise")),                         # no update
    dict(contracting=(None, None), lhs=(64, 64), rhs=(64, 96)),     # square: ambiguous
])
def test_suggest_declines_other_layouts(kw):
  assert arg_specs.suggest(_facts(**kw)) is None


def test_suggested_call_passes_the_guard():
  call = arg_specs.suggest(_facts())
  positional = [_struct(dims, plugins.numpy_dtype_name(dt)) for _, dt, dims, _ in call.arrays]
  check = pk.check_guard(call.op, *positional, interpret=True,
                         **{k: v for k, _, v in call.options})
  assert check.runs, check


def _choose(ops, outputs):
  need = plugins.KernelNeed(FindingKind.UNFUSED_EPILOGUE, "dot", ops, outputs=outputs)
  return library.LIBRARY.kernel_for(types.SimpleNamespace(need=need, boundary_kept=False))


@pytest.mark.parametrize("ops", [("outputs:3", "adam"), ("outputs:3", "cast:f32", "adam")])
def test_the_library_picks_it_for_an_adam_update(ops):
  assert _choose(ops, 3).op == "pallas_kernels.adam_matmul"
  spec = registry.get_spec("adam_matmul")
  need = plugins.KernelNeed(FindingKind.UNFUSED_EPILOGUE, "dot", ops, outputs=3)
  assert library._covers(spec, need) == (True, "")
  assert not library._covers(registry.get_spec("matmul"), need)[0]


def test_the_library_keeps_other_epilogues_off_it():
  assert _choose(("outputs:3", "elementwise"), 3).op is None
  # A cast alone (or a bias) is the matmul's, though adam_matmul takes casts.
  assert _choose(("cast:bf16",), 1).op == "pallas_kernels.matmul"
  assert _choose(("bias", "activation:gelu"), 1).op == "pallas_kernels.matmul"


# ------------------------------------------------- GPU lowering (no GPU) ----

_TRITON_CALL = re.compile(r"stablehlo\.custom_call @(__gpu\$xla\.gpu\.triton|triton_kernel_call\w*)")


def test_lowers_for_a_gpu_with_nothing_left_to_xla(clean_fallbacks):
  # The route of tests/pallas_kernels/lowering_test.py: an abstract H200, lowered for CUDA.
  if guard.gpu.unavailable_reason(True):
    pytest.skip(guard.gpu.unavailable_reason(True))
  device = jax.sharding.AbstractDevice("NVIDIA H200", 132, "cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  x, dy = _struct((70, 77), "bfloat16"), _struct((70, 300), "bfloat16")
  w, count = _struct((77, 300), "float32"), _struct((), "int32")

  def step(x, dy, p, mu, nu, count):
    return adam_matmul(x, dy, p, mu, nu, count, learning_rate=1e-3, weight_decay=1e-4)

  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with jax.sharding.use_abstract_mesh(mesh):
      text = jax.jit(step).trace(x, dy, w, w, w, count).lower(
          lowering_platforms=("cuda",)).as_text()
  assert len(_TRITON_CALL.findall(text)) == 1
  assert "stablehlo.dot_general" not in text
  assert_no_fallback()


def test_on_a_gpu_the_guard_holds_tiles_and_shared_memory_to_their_bounds(monkeypatch):
  # Compiled for a GPU (faked here: no GPU runs this): tiles at Triton's
  # minimum pass and one below it is refused; shared memory likewise.
  monkeypatch.setattr(guard.gpu, "unavailable_reason", lambda interpret: None)
  monkeypatch.setattr(backend, "current_backend", lambda: backend.Backend.GPU)
  x, dy, w = _struct((64, 64), "float32"), _struct((64, 64), "float32"), _struct((64, 64), "float32")
  lo = config_lib.GPU_MIN_BLOCK

  def reason(cfg, limit):
    monkeypatch.setattr(guard.matmul_gpu, "shared_memory_bytes", lambda: limit)
    return guard.unsupported_reason(x, dy, w, w, w, transpose_x=True, interpret=False,
                                    config=cfg)

  at = Config(block_k=lo, block_n=2 * lo, block_m=2 * lo)
  need = config_lib.smem_bytes(at, 4)
  assert reason(at, need) is None
  assert f"Triton dots need tiles >= {lo}" in reason(Config(block_k=lo // 2, block_n=2 * lo,
                                                            block_m=2 * lo), need)
  assert f"needs ~{need // 1024} KiB of shared memory" in reason(at, need - 1)


def test_the_kernel_tells_xla_its_flops_and_bytes():
  # XLA prices the call by its CostEstimate: x^T @ dy's 2 M K N, the
  # update's 16 per weight, a root each, and x, dy and three f32 states.
  m, k, n = 24, 16, 40
  S = jax.ShapeDtypeStruct
  w = S((k, n), jnp.float32)
  jaxpr = jax.make_jaxpr(lambda x, dy, p, mu, nu: adam_matmul(
      x, dy, p, mu, nu, jnp.int32(3), learning_rate=1e-3, implementation="pallas",
      interpret=True))(S((m, k), jnp.float32), S((m, n), jnp.float32), w, w, w)

  def calls(j):
    for e in j.eqns:
      if e.primitive.name == "pallas_call":
        yield e
      for v in e.params.values():
        inner = getattr(v, "jaxpr", v)
        if hasattr(inner, "eqns"):
          yield from calls(inner)

  (call,) = calls(jaxpr.jaxpr)
  cost = call.params["cost_estimate"]
  assert (cost.flops, cost.transcendentals) == (2 * m * k * n + 16 * k * n, k * n)
