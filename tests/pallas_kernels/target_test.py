"""Kernels follow the device their operands are placed on, not the default backend.

The first tests need nothing but this machine: where an op reads its target
from (a concrete array, an abstract mesh, a `targeting` scope, a name). The
rest compile for a GPU this machine does not have, through a compile-only
CUDA topology (`pallas_kernels._src.audit.topology`): an H200 and an A100, with
`ShapeDtypeStruct`s placed by a `SingleDeviceSharding` on the topology's
device, the way a user compiles for a GPU from a CPU. They skip, naming the
pip command, without the CUDA plugin wheels of the installed jax.
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
from pallas_kernels._src.audit import topology

S = jax.ShapeDtypeStruct


@pytest.fixture(autouse=True)
def _fresh_fallbacks():
  guard.clear_fallbacks()
  yield
  guard.clear_fallbacks()


def test_a_concrete_array_names_its_device():
  x = jnp.ones((4, 4))
  assert backend.operand_target([None, x]) == backend.target_of_device(x.devices().pop())


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU-only machines defer")
def test_a_tracer_without_placement_is_decided_at_lowering():
  seen = []
  jax.make_jaxpr(lambda x: seen.append(backend.operand_target([x])) or x)(jnp.ones(3))
  assert seen == [None]


def test_an_abstract_mesh_names_the_target():
  device = jax.sharding.AbstractDevice("NVIDIA H200", 132, "cuda")
  mesh = jax.sharding.AbstractMesh((), (), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    t = backend.operand_target([S((4,), jnp.float32)])
  assert (t.backend, t.compute_capability, t.core_count, t.abstract) == (
      backend.Backend.GPU, 90, 132, True)


def test_targeting_names_an_abstract_device_for_triton():
  h100 = backend.resolve_target("h100")
  with backend.targeting(h100):
    assert backend.target() == h100
    assert jax.sharding.get_abstract_mesh().abstract_device.device_kind == h100.device_kind
  assert backend.target() != h100


def test_resolve_target_names():
  assert backend.resolve_target("H200").compute_capability == 90
  assert backend.resolve_target("a100").core_count == 108
  assert backend.resolve_target("cpu").backend is backend.Backend.CPU
  with pytest.raises(ValueError, match="unknown target 'v100'"):
    backend.resolve_target("v100")


# ----------------------------------------------------- compiled for a GPU ----

_NEEDS_WHEELS = pytest.mark.skipif(topology.unavailable_reason() is not None,
                                   reason=f"no GPU compile: {topology.unavailable_reason()}")


def _custom_calls(compiled) -> list[str]:
  return re.findall(r'custom_call_target="([^"]+)"', compiled.as_text())


def _kernels(compiled) -> list[str]:
  # Triton kernels, Mosaic GPU kernels: the Pallas custom calls.
  return [c for c in _custom_calls(compiled) if "triton" in c or "mosaic" in c]


M, K, N = 300, 512, 256
_OPS = {
    "matmul": (lambda x, w, b, impl: pk.matmul(x, w, bias=b, activation="gelu",
                                               implementation=impl),
               (S((M, K), jnp.bfloat16), S((K, N), jnp.bfloat16), S((N,), jnp.bfloat16))),
    "layer_norm": (lambda x, g, impl: pk.layer_norm(x, g, g, implementation=impl),
                   (S((M, K), jnp.bfloat16), S((K,), jnp.bfloat16))),
    "rms_norm": (lambda x, g, impl: pk.rms_norm(x, g, implementation=impl),
                 (S((M, K), jnp.bfloat16), S((K,), jnp.bfloat16))),
    "softmax": (lambda x, impl: pk.softmax(x, implementation=impl), (S((M, K), jnp.float32),)),
}


@_NEEDS_WHEELS
@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(topology.SPECS))
@pytest.mark.parametrize("implementation", [None, "pallas"])
@pytest.mark.parametrize("op", sorted(_OPS))
def test_compiled_for_a_gpu_each_op_holds_its_kernel(op, implementation, arch):
  fn, specs = _OPS[op]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    compiled = topology.compile_for(arch, lambda *a: fn(*a, implementation), *specs)
  assert len(_kernels(compiled)) == 1, _custom_calls(compiled)
  assert not pk.fallbacks(), pk.fallbacks()


@_NEEDS_WHEELS
@pytest.mark.slow
def test_a_gpu_fallback_is_recorded_for_the_device_compiled_for():
  # float8 conversions need sm_89: the A100 build falls back, and says so.
  fn = lambda x, w: pk.matmul(x, w, out_dtype=jnp.bfloat16)
  specs = S((M, K), jnp.float8_e4m3fn), S((K, N), jnp.float8_e4m3fn)
  compiled = topology.compile_for("sm_80", fn, *specs)
  assert not _kernels(compiled)
  [f] = pk.fallbacks()
  assert f.reason.startswith("when lowered for NVIDIA A100-SXM4-80GB: float8_e4m3fn "
                             "conversion needs compute capability >= 8.9, got 80"), f


@_NEEDS_WHEELS
@pytest.mark.slow
def test_a_named_sharding_on_the_topology_is_read_while_tracing():
  mesh = jax.sharding.Mesh([topology.device("sm_90a")], ("x",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  seen = []

  def fn(x, g):
    seen.append(backend.operand_target([x]))
    return pk.rms_norm(x, g)

  specs = [S((M, K), jnp.bfloat16, sharding=sharding), S((K,), jnp.bfloat16, sharding=sharding)]
  compiled = jax.jit(fn).trace(*specs).lower().compile()
  assert seen[0].compute_capability == 90 and seen[0].abstract
  assert len(_kernels(compiled)) == 1 and not pk.fallbacks()


def test_check_guard_asks_the_named_target():
  # float8 outputs need sm_89: an A100's guard says no, an H100's yes.
  x, w = S((64, 64), jnp.bfloat16), S((64, 64), jnp.bfloat16)
  a100 = pk.check_guard("matmul", x, w, out_dtype=jnp.float8_e4m3fn, target="a100")
  h100 = pk.check_guard("matmul", x, w, out_dtype=jnp.float8_e4m3fn, target="h100")
  assert (a100.backend, a100.interpret) == ("gpu", False)
  assert "compute capability >= 8.9, got 80" in a100.reason
  assert h100.runs and h100.device_kind == "NVIDIA H100 SXM"


def test_swap_builds_for_its_target():
  def mlp(x, w, b):
    return jax.nn.gelu(x @ w + b, approximate=False)

  specs = S((32, 64), jnp.bfloat16), S((64, 32), jnp.bfloat16), S((32,), jnp.bfloat16)
  swapped = pk.swap(mlp, target="h200")
  assert swapped.target.compute_capability == 90
  [site] = swapped.report(*specs).sites
  assert site.replaced, site
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    text = jax.jit(swapped).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
  # Built for the H200 alone: one compiled kernel, no interpreted loop.
  assert len(re.findall(r"custom_call @", text)) == 1 and "stablehlo.while" not in text


@_NEEDS_WHEELS
@pytest.mark.slow
@pytest.mark.skipif(compat.mosaic_gpu_unavailable_reason() is not None,
                    reason=str(compat.mosaic_gpu_unavailable_reason()))
@pytest.mark.parametrize("arch,expected", [("sm_90a", "mosaic_gpu_v2"),
                                           ("sm_80", "__gpu$xla.gpu.triton")])
def test_the_matmul_compiles_through_the_targets_backend(arch, expected):
  fn = lambda x, w, b, r: pk.matmul(x, w, bias=b, residual=r, activation="gelu")
  specs = (S((256, 512), jnp.bfloat16), S((512, 256), jnp.bfloat16),
           S((256,), jnp.bfloat16), S((256, 256), jnp.bfloat16))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    compiled = topology.compile_for(arch, fn, *specs)
  assert _kernels(compiled) == [expected], _custom_calls(compiled)
  assert not pk.fallbacks()
