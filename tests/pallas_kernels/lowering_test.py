"""Every op lowers for a GPU this machine does not have, through the public route.

`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` inside
`jax.sharding.use_abstract_mesh` with an abstract H200 (and, on a JAX whose
Triton lowering needs no abstract device, without one: the H200 default) must
emit one Triton kernel custom call per kernel, with the epilogue operands fed
to the kernel and no epilogue math left to XLA. No GPU and no patching.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import compat
from pallas_kernels._src import guard

S = jax.ShapeDtypeStruct
_KERNEL_CALL = re.compile(r"stablehlo\.custom_call @(__gpu\$xla\.gpu\.triton|triton_kernel_call\w*)"
                          r"\(([^)]*)\)")
# Epilogue and softmax/normalization math that must stay inside the kernels.
_EPILOGUE_OPS = ("chlo.erf", "stablehlo.tanh", "stablehlo.logistic", "stablehlo.exponential",
                 "stablehlo.rsqrt", "stablehlo.dot_general", "stablehlo.clamp")


def _mesh(kind: str = "NVIDIA H200", cores: int = 132):
  device = jax.sharding.AbstractDevice(kind, cores, "cuda")
  return jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)


def _lower_for_gpu(fn, *specs, kind: str = "NVIDIA H200") -> str:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with jax.sharding.use_abstract_mesh(_mesh(kind)):
      return jax.jit(fn, keep_unused=True).trace(*specs).lower(
          lowering_platforms=("cuda",)).as_text()


def _kernel_calls(text: str) -> list[tuple[str, ...]]:
  """Operand lists of the Triton kernel custom calls in lowered StableHLO."""
  return [tuple(a.strip() for a in m.group(2).split(",") if a.strip())
          for m in _KERNEL_CALL.finditer(text)]


_LAYOUT_OP = re.compile(r"^\s*(%[\w#]+) = stablehlo\.(?:reshape|convert|broadcast_in_dim|"
                        r"transpose|bitcast_convert) (%[\w#]+)", re.M)


def _sources(text: str, values: tuple[str, ...]) -> set[str]:
  """The values, followed back through reshapes, converts and broadcasts."""
  producer = dict(_LAYOUT_OP.findall(text))
  out = set()
  for v in values:
    while v in producer:
      v = producer[v]
    out.add(v)
  return out


def _check(text: str, kernels: int, fed: tuple[str, ...] = ()):
  calls = _kernel_calls(text)
  assert len(calls) == kernels, f"expected {kernels} kernel calls, got {len(calls)}"
  # (A scalar i32 clamp is `lax.switch`'s index among deferred GPU builds.)
  body = re.sub(r"^.*stablehlo\.clamp .*: tensor<i32>$", "", text, flags=re.M)
  leaked = [op for op in _EPILOGUE_OPS if op in body]
  assert not leaked, f"epilogue math left to XLA: {leaked}"
  # The epilogue operands go straight into the first (forward) kernel.
  sources = _sources(text, calls[0]) if calls else set()
  for arg in fed:
    assert arg in sources, f"{arg} does not feed the kernel (operands {calls[0]})"


@pytest.fixture(autouse=True)
def _no_fallbacks():
  guard.clear_fallbacks()
  yield
  assert not pk.fallbacks(), f"unexpected fallbacks: {pk.fallbacks()}"
  guard.clear_fallbacks()


# (x dtype, w dtype, w scale kind): every dtype pair the kernel takes.
_DTYPES = [
    ("float32", "float32", None),
    ("bfloat16", "bfloat16", None),
    ("float16", "float16", None),
    ("bfloat16", "int8", "channel"),
    ("bfloat16", "int4", "group"),
    ("float16", "int4", "group"),
    ("float8_e4m3fn", "float8_e5m2", "channel"),
    ("int8", "int8", "row"),
]
# Epilogue variants: keyword sets (names of operands that must feed the kernel).
_EPILOGUES = {
    "plain": (),
    "bias_gelu_residual": ("bias", "residual"),
    "scale_silu_clamp": ("scale",),
    "transposed_tanh": (),
    "quantize_int8": ("bias",),
}
M, K, N = 300, 320, 256  # Ragged M; K not a power of two.


def _matmul_fn(x_dtype, w_dtype, w_scale, epilogue):
  tx = tw = to = epilogue == "transposed_tanh"
  if w_dtype == "int4":
    tw = False  # int4 is packed along N: transpose_w is its own case below.
  xs = S((K, M) if tx else (M, K), jnp.dtype(x_dtype))
  ws = S((N, K) if tw else (K, N), jnp.dtype(w_dtype))
  specs = {"x": xs, "w": ws, "bias": S((N,), jnp.float32),
           "residual": S((N, M) if to else (M, N), jnp.bfloat16),
           "scale": S((N,), jnp.float32)}
  if w_scale == "channel":
    specs["w_scale"] = S((N,), jnp.float32)
  elif w_scale == "group":
    specs["w_scale"] = S((K // 64, N), jnp.float32)
  elif w_scale == "row":
    specs["x_scale"] = S((M,), jnp.float32)
    specs["w_scale"] = S((N,), jnp.float32)
  names = tuple(specs)

  def fn(*args):
    a = dict(zip(names, args))
    kw = dict(implementation="pallas", transpose_x=tx, transpose_w=tw, transpose_out=to,
              w_scale=a.get("w_scale"), x_scale=a.get("x_scale"),
              w_group_size=64 if w_scale == "group" else None)
    if epilogue == "bias_gelu_residual":
      kw.update(bias=a["bias"], activation="gelu", residual=a["residual"])
    elif epilogue == "scale_silu_clamp":
      kw.update(scale=a["scale"], activation="silu", clamp=(-4.0, 4.0))
    elif epilogue == "transposed_tanh":
      kw.update(activation="tanh")
    elif epilogue == "quantize_int8":
      kw.update(bias=a["bias"], activation="relu", quantize="int8")
    if x_dtype == "int8" or "float8" in x_dtype:
      kw.setdefault("out_dtype", None if epilogue == "quantize_int8" else jnp.bfloat16)
    return pk.matmul(a["x"], a["w"], **kw)

  return fn, names, [specs[n] for n in names]


def _arg_names(names, wanted):
  return tuple(f"%arg{names.index(w)}" for w in wanted)


@pytest.mark.parametrize("epilogue", list(_EPILOGUES))
@pytest.mark.parametrize("x_dtype,w_dtype,w_scale", _DTYPES)
def test_matmul_forward_lowers_to_one_kernel(x_dtype, w_dtype, w_scale, epilogue):
  fn, names, specs = _matmul_fn(x_dtype, w_dtype, w_scale, epilogue)
  text = _lower_for_gpu(fn, *specs)
  _check(text, 1, _arg_names(names, _EPILOGUES[epilogue]))


_FLOAT = [d for d in _DTYPES if d[0] == d[1]]


@pytest.mark.parametrize("epilogue", ["plain", "bias_gelu_residual", "scale_silu_clamp",
                                      "transposed_tanh"])
@pytest.mark.parametrize("x_dtype,w_dtype,w_scale", _FLOAT[:3] + [_DTYPES[3]])
def test_matmul_backward_lowers_to_kernels(x_dtype, w_dtype, w_scale, epilogue):
  fn, names, specs = _matmul_fn(x_dtype, w_dtype, w_scale, epilogue)
  float_args = [i for i, n in enumerate(names)
                if n in ("x", "w", "bias", "residual", "scale")
                and jnp.issubdtype(specs[i].dtype, jnp.floating)]
  grad = jax.grad(lambda *a: fn(*a).astype(jnp.float32).sum(), argnums=tuple(float_args))
  text = _lower_for_gpu(grad, *specs)
  # forward + fused dAct/bias-grad (when an epilogue needs its input) + dx + dw;
  # quantized w has no dw.
  kernels = 1 + (epilogue != "plain") + 1 + (w_dtype == x_dtype)
  _check(text, kernels)


def test_int4_transpose_w_lowers_to_one_kernel():
  fn = lambda x, w, s: pk.matmul(x, w, w_scale=s, w_group_size=64, transpose_w=True,
                                 implementation="pallas")
  _check(_lower_for_gpu(fn, S((M, K), jnp.bfloat16), S((N, K), jnp.int4),
                        S((K // 64, N), jnp.float32)), 1)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("variant", ["plain", "residual", "quantize"])
def test_normalization_lowers_to_one_kernel_each_way(kind, dtype, variant):
  op = getattr(pk, kind)
  shape = (300, 768)
  x, g = S(shape, jnp.dtype(dtype)), S((768,), jnp.dtype(dtype))

  def fn(x, g, r):
    kw = dict(implementation="pallas")
    if variant == "residual":
      kw["residual"] = r
    if variant == "quantize":
      kw["quantize"] = "int8"
    args = (x, g, g) if kind == "layer_norm" else (x, g)
    return op(*args, **kw)

  _check(_lower_for_gpu(fn, x, g, x), 1, ("%arg0", "%arg2") if variant == "residual" else ())
  if variant == "quantize":
    return  # not differentiable

  def loss(x, g, r):
    out = fn(x, g, r)
    y = out[0] if isinstance(out, tuple) else out
    return y.astype(jnp.float32).sum()

  _check(_lower_for_gpu(jax.grad(loss, argnums=(0, 1, 2)), x, g, x), 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("variant", ["plain", "causal", "mask"])
def test_softmax_lowers_to_one_kernel_each_way(dtype, variant):
  shape = (2, 4, 128, 200)
  x = S(shape, jnp.dtype(dtype))
  mask = S((1, 1, 128, 200), jnp.bool_)

  def fn(x, m):
    return pk.softmax(x, scale=0.125, causal=variant == "causal",
                      mask=m if variant == "mask" else None, implementation="pallas")

  _check(_lower_for_gpu(fn, x, mask), 1, ("%arg1",) if variant == "mask" else ())
  grad = jax.grad(lambda x, m: fn(x, m).astype(jnp.float32).sum())
  _check(_lower_for_gpu(grad, x, mask), 2)


_TRITON_LAUNCH = re.compile(r"num_stages = (\d+) : i32, num_warps = (\d+) : i32")


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_a_configs_warps_and_stages_reach_the_triton_call(op):
  from pallas_kernels._src.ops.normalization.config import Config as NormConfig
  from pallas_kernels._src.ops.softmax.config import Config as SoftmaxConfig
  x, g = S((256, 512), jnp.float32), S((512,), jnp.float32)
  if op == "softmax":
    cfg = SoftmaxConfig(block_rows=8, block_cols=512, num_warps=2, num_stages=2)
    fn = lambda x, g: pk.softmax(x, implementation="pallas", config=cfg)  # noqa: E731
  else:
    cfg = NormConfig(block_rows=8, block_cols=512, num_warps=2, num_stages=2)
    fn = lambda x, g: pk.layer_norm(x, g, g, implementation="pallas", config=cfg)  # noqa: E731
  text = _lower_for_gpu(fn, x, g)
  if "__gpu$xla.gpu.triton" not in text:
    pytest.skip("this JAX serializes the Triton call's launch parameters")
  assert _TRITON_LAUNCH.findall(text) == [("2", "2")]


def test_target_follows_the_abstract_device():
  with jax.sharding.use_abstract_mesh(_mesh("NVIDIA A100-SXM4-80GB", 108)):
    t = backend.target()
  assert (t.backend, t.compute_capability, t.abstract) == (backend.Backend.GPU, 80, True)
  assert backend.target() == backend._local_target()  # noqa: SLF001
  # Traced for the named device alone: one kernel, no per-platform branches.
  fn = lambda x, w: pk.matmul(x, w, implementation="pallas")
  spec = S((64, 64), jnp.bfloat16)
  with jax.sharding.use_abstract_mesh(_mesh()):
    jaxpr = str(jax.make_jaxpr(fn)(spec, spec))
  # A Triton kernel is a pallas_call, a Mosaic GPU kernel an mpmd_map.
  assert jaxpr.count("pallas_call[") + jaxpr.count("mpmd_map[") == 1, jaxpr
  assert "platform_index" not in jaxpr


def test_a100_target_guards_float8_out():
  fn = lambda x, w: pk.matmul(x, w, out_dtype=jnp.bfloat16, implementation="pallas")
  text = _lower_for_gpu(fn, S((M, K), jnp.float8_e4m3fn), S((K, N), jnp.float8_e5m2),
                        kind="NVIDIA A100-SXM4-80GB")
  assert not _kernel_calls(text)
  reasons = [f.reason for f in pk.fallbacks()]
  guard.clear_fallbacks()
  assert any("compute capability >= 8.9, got 80" in r for r in reasons), reasons


def test_without_an_abstract_device_lowers_for_the_default_h200():
  fn = lambda x, w, b: pk.matmul(x, w, bias=b, activation="gelu", implementation="pallas")
  specs = S((M, K), jnp.bfloat16), S((K, N), jnp.bfloat16), S((N,), jnp.bfloat16)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    cuda = jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
  # One build per deferred GPU in a `case` on a constant index (XLA keeps one).
  _check(cuda, len(backend.DEFERRED_GPUS), ("%arg2",))
  # The same trace lowered for this CPU keeps the interpreted kernel instead.
  cpu = jax.jit(fn).trace(*specs).lower().as_text()
  assert not _kernel_calls(cpu)


def _kernel_dot_precisions(fn, *specs) -> set[str]:
  with jax.sharding.use_abstract_mesh(_mesh()):
    jaxpr = str(jax.make_jaxpr(fn)(*specs))
  return set(re.findall(r"precision=\(Precision\.(\w+)", jaxpr))


def test_float32_follows_the_callers_precision_like_xla():
  from pallas_kernels._src.ops.matmul import gpu  # noqa: PLC0415
  f32 = S((256, 256), jnp.float32), S((256, 256), jnp.float32)
  # The Triton kernel's dots (Mosaic GPU's wgmma runs float32 as TF32 only).
  dot = lambda precision: lambda x, w: pk.matmul(x, w, implementation="pallas",
                                                 precision=precision, backend="triton")
  # DEFAULT (what jnp.matmul uses, TF32 tensor cores on a GPU) unless told.
  assert _kernel_dot_precisions(dot(None), *f32) == {"DEFAULT"}
  assert _kernel_dot_precisions(dot(jax.lax.Precision.HIGHEST), *f32) == {"HIGHEST"}
  with jax.default_matmul_precision("float32"):
    assert _kernel_dot_precisions(dot(None), *f32) == {"HIGHEST"}
  assert gpu.resolve_precision("tensorfloat32") == "HIGH"
  assert gpu.resolve_precision((jax.lax.Precision.DEFAULT, "highest")) == "HIGHEST"
  with pytest.raises(ValueError, match="precision must be None, a jax.lax.Precision"):
    pk.matmul(jnp.ones((4, 4)), jnp.ones((4, 4)), precision="F32_F32_F32")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the lowering-time choice is CPU-only")
def test_a_cuda_only_fallback_is_recorded_when_lowered_for_cuda():
  # int4 packed along an N (40) no GPU tile divides: the CUDA builds fall
  # back, the interpreted one does not. Nothing is recorded while tracing
  # (no build is chosen yet); lowering for CUDA records the CUDA build's
  # reason, naming the device it assumed, and lowering for this CPU nothing.
  fn = lambda x, w, s: pk.matmul(x, w, w_scale=s, implementation="pallas")
  traced = jax.jit(fn).trace(S((16, 64), jnp.bfloat16), S((64, 40), jnp.int4),
                             S((40,), jnp.float32))
  assert not pk.fallbacks()
  traced.lower()
  assert not pk.fallbacks()
  traced.lower(lowering_platforms=("cuda",))
  [f] = pk.fallbacks()
  guard.clear_fallbacks()
  assert f.reason.startswith("when lowered for CUDA (NVIDIA H200 assumed): int4 w"), f


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the lowering-time choice is CPU-only")
def test_default_implementation_holds_kernels_when_lowered_for_cuda():
  # No implementation named: XLA on this CPU, the kernel in the CUDA lowering.
  fn = lambda x, w, b: pk.matmul(x, w, bias=b, activation="gelu")
  specs = S((M, K), jnp.bfloat16), S((K, N), jnp.bfloat16), S((N,), jnp.bfloat16)
  traced = jax.jit(fn).trace(*specs)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    _check(traced.lower(lowering_platforms=("cuda",)).as_text(), len(backend.DEFERRED_GPUS),
           ("%arg2",))
  cpu = traced.lower().as_text()
  assert not _kernel_calls(cpu) and "pallas" not in cpu


def test_lowering_target_picks_the_build_of_the_gpu_family():
  assert backend.lowering_target("cpu", ()) == (0, "")
  index, where = backend.lowering_target("cuda", ())
  assert index == 1 and "NVIDIA H200 assumed" in where
  assert backend._nearest_deferred(90) == 0  # noqa: SLF001
  assert backend._nearest_deferred(80) == 1  # noqa: SLF001
  assert backend._nearest_deferred(89) == 1  # noqa: SLF001
  # Blackwell has no wgmma: the Ampere build (mma.sync) runs there.
  assert backend._nearest_deferred(100) == 1  # noqa: SLF001
