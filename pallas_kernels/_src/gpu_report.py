"""Compile the kernels' Triton IR for a GPU without one: registers, spills, shared memory.

The Triton kernels' report (the matmul built with `backend="triton"`, as on
Ampere; the row ops), printed by `python -m pallas_kernels compile-report
--backend triton`; the Mosaic GPU matmul's is `compile_report.py`.

The route: lower an op for "cuda" under an abstract mesh naming the device
(`backend.target` follows it), read each Triton kernel custom call's backend
config (the kernel's Triton IR as MLIR bytecode, `num_warps`, `num_stages`),
and compile that IR with the `triton` package from pip, which ships `ptxas`.
`ptxas -v` then reports registers and spill bytes; Triton's metadata the
dynamic shared memory; the PTX whether the dots became wgmma (Hopper) or
mma.sync (Ampere) instructions or stayed on the FMA units.

What this cannot show: run time, occupancy under real contention, or whether
XLA's own Triton pipeline (which compiles the same IR on a GPU) picks other
passes than pip Triton's. Pip Triton must read this JAX's Triton dialect: JAX
0.12 and Triton 3.9 agree; older JAX writes bytecode Triton 3.9 rejects
(`IrUnreadable`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

#: Device kind and sm arch of each compile target.
ARCHS = {"sm_90a": ("NVIDIA H200", 132, 90), "sm_80": ("NVIDIA A100-SXM4-80GB", 108, 80)}
#: Opt-in shared memory per block by arch (CUDA programming guide, compute
#: capability tables): 227 KiB on sm_90, 163 KiB on sm_80.
SMEM_LIMIT = {"sm_90a": 227 * 1024, "sm_80": 163 * 1024}
_TRITON_TARGETS = ("__gpu$xla.gpu.triton",)


class IrUnreadable(RuntimeError):
  """Pip Triton cannot parse the Triton IR this JAX wrote."""


@dataclasses.dataclass(frozen=True, slots=True)
class KernelIr:
  """One Triton kernel custom call of a lowered module."""

  name: str
  ir: bytes
  num_warps: int
  num_stages: int


@dataclasses.dataclass(frozen=True, slots=True)
class KernelStats:
  """What ptxas and Triton say about one compiled kernel."""

  case: str
  kernel: str
  arch: str
  num_warps: int
  num_stages: int
  registers: int
  spill_stores: int
  spill_loads: int
  #: Dynamic shared memory Triton allocates, bytes.
  shared: int
  #: "wgmma", "mma" or "fma": what the dots compiled to ("-" if none).
  dot_unit: str

  @property
  def spills(self) -> int:
    return self.spill_stores + self.spill_loads

  @property
  def fits(self) -> bool:
    return self.spills == 0 and self.shared <= SMEM_LIMIT[self.arch]


def abstract_mesh(arch: str):
  """An abstract one-device mesh naming the GPU of `arch`."""
  kind, cores, _ = ARCHS[arch]
  device = jax.sharding.AbstractDevice(kind, cores, "cuda")
  return jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)


def lower_for(arch: str, fn: Callable[..., Any], *specs) -> Any:
  """`jax.jit(fn)` lowered for "cuda" with the abstract GPU of `arch`."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with jax.sharding.use_abstract_mesh(abstract_mesh(arch)):
      return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))


def _walk(op):
  yield op
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        yield from _walk(inner)


def kernel_irs(lowered) -> list[KernelIr]:
  """The Triton kernels of a lowered module, in program order."""
  module = lowered.compiler_ir("stablehlo")
  out = []
  for top in module.body.operations:
    for op in _walk(top.operation):
      if op.name != "stablehlo.custom_call":
        continue
      target = str(op.attributes["call_target_name"]).strip('"')
      if target not in _TRITON_TARGETS:
        continue
      cfg = {a.name: a.attr for a in op.attributes["mhlo.backend_config"]}
      out.append(KernelIr(name=str(cfg["name"]).strip('"'), ir=bytes(cfg["ir"].value_bytes),
                          num_warps=int(cfg["num_warps"].value),
                          num_stages=int(cfg["num_stages"].value)))
  return out


@functools.cache
def _triton():
  import triton  # noqa: PLC0415 - optional, test-only dependency.
  from triton._C.libtriton import ir  # noqa: PLC0415
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415
  return triton, ir, GPUTarget


def triton_available() -> bool:
  try:
    _triton()
  except ImportError:
    return False
  return True


def _ttir_text(ir_bytes: bytes, workdir: str) -> str:
  """The Triton IR bytecode as text TTIR (what `triton.compile` takes)."""
  triton, ir, GPUTarget = _triton()
  from triton.backends.nvidia.compiler import CUDABackend  # noqa: PLC0415
  path = os.path.join(workdir, "kernel.mlirbc")
  with open(path, "wb") as f:
    f.write(ir_bytes)
  ctx = ir.context()
  ir.load_dialects(ctx)
  CUDABackend(GPUTarget("cuda", 90, 32)).load_dialects(ctx)
  try:
    return str(ir.parse_mlir_module(path, ctx))
  except RuntimeError as e:
    raise IrUnreadable(
        f"triton {triton.__version__} cannot read the Triton IR of jax {jax.__version__} "
        f"({e}); use the newest JAX (0.12 reads with Triton 3.9)") from None


_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_usage(ptx: str, arch: str, workdir: str) -> tuple[int, int, int]:
  """(registers, spill store bytes, spill load bytes) from `ptxas -v`."""
  # The ptxas Triton itself uses for this arch (it ships two).
  from triton.backends.nvidia.compiler import get_ptxas  # noqa: PLC0415
  ptxas = get_ptxas(ARCHS[arch][2]).path
  src = os.path.join(workdir, "kernel.ptx")
  with open(src, "w") as f:
    f.write(ptx)
  # The flags Triton's own ptxas call uses (verbose for the usage lines).
  cmd = [ptxas, "-v", "--regAllocOptLevel=2", f"--gpu-name={arch}", src, "-o", src + ".o"]
  res = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if res.returncode:
    raise RuntimeError(f"ptxas failed for {arch}: {res.stderr[-2000:]}")
  log = res.stdout + res.stderr
  regs = max((int(r) for r in _REGS.findall(log)), default=0)
  spills = [(int(a), int(b)) for a, b in _SPILL.findall(log)]
  return regs, max((a for a, _ in spills), default=0), max((b for _, b in spills), default=0)


def compile_kernel(case: str, kernel: KernelIr, arch: str) -> KernelStats:
  """Compiles one kernel's Triton IR for `arch` ("sm_90a" or "sm_80")."""
  triton, _, GPUTarget = _triton()
  cc = ARCHS[arch][2]
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "kernel.ttir")
    with open(path, "w") as f:
      f.write(_ttir_text(kernel.ir, tmp))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", UserWarning)  # Triton's FP-fusion notice.
      compiled = triton.compile(path, target=GPUTarget("cuda", cc, 32),
                                options=dict(num_warps=kernel.num_warps,
                                             num_stages=kernel.num_stages))
    ptx = compiled.asm["ptx"]
    regs, st, ld = _ptxas_usage(ptx, arch, tmp)
  if "wgmma" in ptx:
    unit = "wgmma"
  elif "mma.sync" in ptx:
    unit = "mma"
  elif "fma.rn.f32" in ptx:
    unit = "fma"
  else:
    unit = "-"
  return KernelStats(case=case, kernel=kernel.name, arch=arch, num_warps=kernel.num_warps,
                     num_stages=kernel.num_stages, registers=regs, spill_stores=st,
                     spill_loads=ld, shared=int(compiled.metadata.shared), dot_unit=unit)


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
  """One op call to report: a name, the function and its argument specs."""

  name: str
  fn: Callable[..., Any]
  specs: tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
  """Compiled kernels, and the cases whose op fell back to XLA on an arch."""

  rows: tuple[KernelStats, ...]
  #: (case, arch, reason) for each fallback recorded while lowering.
  fallbacks: tuple[tuple[str, str, str], ...] = ()


def report(cases: Sequence[Case], archs: Sequence[str] = ("sm_90a", "sm_80")) -> Report:
  """Stats of every Triton kernel of every case, for every arch."""
  from pallas_kernels._src import guard  # noqa: PLC0415
  rows, fell_back = [], []
  for arch in archs:
    for case in cases:
      with guard.collect_fallbacks() as records:
        lowered = lower_for(arch, case.fn, *case.specs)
      fell_back += [(case.name, arch, f.reason) for f in records]
      for kernel in kernel_irs(lowered):
        rows.append(compile_kernel(case.name, kernel, arch))
  return Report(tuple(rows), tuple(fell_back))


def format_table(rows: Sequence[KernelStats]) -> str:
  """A fixed-width table, one line per kernel and arch."""
  head = (f"{'case':<38} {'kernel':<26} {'arch':<7} {'warps':>5} {'stages':>6} "
          f"{'regs':>4} {'spill st/ld B':>13} {'smem B':>7} {'dot':<5} fits")
  lines = [head, "-" * len(head)]
  for r in rows:
    spill = f"{r.spill_stores}/{r.spill_loads}"
    lines.append(f"{r.case:<38} {r.kernel:<26} {r.arch:<7} {r.num_warps:>5} "
                 f"{r.num_stages:>6} {r.registers:>4} {spill:>13} {r.shared:>7} "
                 f"{r.dot_unit:<5} {'yes' if r.fits else 'NO'}")
  return "\n".join(lines)


def default_cases() -> list[Case]:
  """Every kernel at its default config: the shapes of docs/ops.md and each dtype path,
  forward and backward."""
  import jax.numpy as jnp  # noqa: PLC0415
  import pallas_kernels as pk  # noqa: PLC0415
  S = jax.ShapeDtypeStruct
  bf, f32 = jnp.bfloat16, jnp.float32
  m, k, n = 8192, 512, 8192

  def mm(**kw):
    return lambda x, w, b, r: pk.matmul(x, w, bias=b, residual=r, implementation="pallas", backend="triton",
                                        **kw)

  def grad(f, argnums):
    return jax.grad(lambda *a: f(*a).astype(f32).sum(), argnums=argnums)

  mm_specs = (S((m, k), bf), S((k, n), bf), S((n,), bf), S((m, n), bf))
  cases = [
      Case("matmul bf16 bias+gelu+residual", mm(activation="gelu"), mm_specs),
      Case("matmul bf16 plain 4096^3",
           lambda x, w: pk.matmul(x, w, implementation="pallas", backend="triton"),
           (S((4096, 4096), bf), S((4096, 4096), bf))),
      Case("matmul f32 highest bias+gelu+res", mm(activation="gelu", precision="highest"),
           tuple(S(s.shape, f32) for s in mm_specs)),
      Case("matmul bf16 grad (dact, dx, dw)", grad(mm(activation="gelu"), (0, 1, 2)),
           mm_specs),
  ]
  # Quantized weights: per-channel int8 and fp8, per-group int4 (both layouts).
  for label, wdt, tw, group in (("int8", jnp.int8, False, None),
                                ("fp8", jnp.float8_e4m3fn, False, None),
                                ("int4 g128", jnp.int4, False, 128),
                                ("int4 g128 transpose_w", jnp.int4, True, 128)):
    wshape = (n, k) if tw else (k, n)
    sshape = (k // group, n) if group else (n,)
    fn = (lambda tw, group: lambda x, w, s, b: pk.matmul(
        x, w, w_scale=s, w_group_size=group, transpose_w=tw, bias=b, activation="gelu",
        implementation="pallas", backend="triton"))(tw, group)
    cases.append(Case(f"matmul bf16 x {label} w", fn,
                      (S((m, k), bf), S(wshape, wdt), S(sshape, f32), S((n,), bf))))
  cases += [
      Case("matmul f32 tf32 (precision default)", mm(activation="gelu", precision="default"),
           tuple(S(s.shape, f32) for s in mm_specs)),
      Case("matmul bf16 decode m=16 x int8 w",
           lambda x, w, s: pk.matmul(x, w, w_scale=s, implementation="pallas", backend="triton"),
           (S((16, 8192), bf), S((8192, 8192), jnp.int8), S((8192,), f32))),
      # A dense layer's weight and bias gradients: dW = x^T @ dy, db = sum(dy, 0).
      Case("matmul bf16 dW+db (transpose_x, w_column_sum)",
           lambda x, dy: pk.matmul(x, dy, transpose_x=True, w_column_sum=True,
                                   implementation="pallas", backend="triton"),
           (S((8192, 512), bf), S((8192, 8192), bf))),
      # An MLP backward's dz = (dy @ w2^T) * gelu'(z): w2 stored [H, D], z read on store.
      Case("matmul bf16 dgelu(z) transpose_w",
           lambda dy, w2, z: pk.matmul(dy, w2, transpose_w=True, activation_grad="gelu",
                                       preactivation=z, implementation="pallas",
                                       backend="triton"),
           (S((m, k), bf), S((n, k), bf), S((m, n), bf))),
      Case("matmul bf16 quantize=int8 n=256",
           lambda x, w, b: pk.matmul(x, w, bias=b, activation="gelu", quantize="int8",
                                     implementation="pallas", backend="triton"),
           (S((8192, 512), bf), S((512, 256), bf), S((256,), bf))),
  ]
  x = S((8192, 8192), bf)
  g = S((8192,), bf)
  ln = lambda x, g, r: pk.layer_norm(x, g, g, residual=r, implementation="pallas")[0]
  rms = lambda x, g, r: pk.rms_norm(x, g, residual=r, implementation="pallas")[0]
  sm = lambda s: pk.softmax(s, causal=True, implementation="pallas")
  s = S((4096, 4096), bf)
  cases += [
      Case("layer_norm+residual bf16 fwd", ln, (x, g, x)),
      Case("layer_norm+residual bf16 grad", grad(ln, (0, 1, 2)), (x, g, x)),
      Case("rms_norm+residual bf16 fwd", rms, (x, g, x)),
      Case("softmax causal bf16 fwd", sm, (s,)),
      Case("softmax causal bf16 grad", grad(sm, 0), (s,)),
  ]
  # Llama-3-8B's SwiGLU MLP: both projections' accumulators in one kernel.
  glu = lambda x, wg, wu: pk.glu_matmul(x, wg, wu, activation="silu", implementation="pallas")
  glu_specs = (S((8192, 4096), bf), S((4096, 14336), bf), S((4096, 14336), bf))
  cases += [
      Case("glu_matmul silu bf16 fwd", glu, glu_specs),
      Case("glu_matmul silu bf16 grad", grad(glu, (0, 1, 2)), glu_specs),
  ]
  # A weight gradient with its Adam step: dW lives in registers only.
  adam = lambda x, dy, p, mu, nu, c: pk.adam_matmul(
      x, dy, p, mu, nu, c, learning_rate=1e-3, weight_decay=1e-4, implementation="pallas")
  state = (S((4096, 4096), f32),) * 3 + (S((), jnp.int32),)
  cases += [
      Case("adam_matmul bf16 dW, f32 state", adam,
           (S((8192, 4096), bf), S((8192, 4096), bf)) + state),
      Case("adam_matmul f32 dW", adam, (S((8192, 4096), f32), S((8192, 4096), f32)) + state),
  ]
  # An LM head: D and V too wide for one tile, the D loop and atomics at work.
  lce = lambda x, w, l: pk.linear_cross_entropy(x, w, l, implementation="pallas")
  lce_specs = (S((8192, 4096), bf), S((4096, 32768), bf), S((8192,), jnp.int32))
  cases += [
      Case("linear_cross_entropy bf16 fwd", lce, lce_specs),
      Case("linear_cross_entropy bf16 grad", jax.grad(lce, argnums=(0, 1)), lce_specs),
  ]
  # A mixed-precision head: f32 parameters read as they are, rounded to
  # bf16 in registers (compute_dtype), the f32 tiles' shared memory priced.
  lce_mixed = lambda x, w, l: pk.linear_cross_entropy(  # noqa: E731
      x, w, l, compute_dtype=bf, implementation="pallas")
  mixed_specs = (S((8192, 4096), f32), S((4096, 32768), f32), S((8192,), jnp.int32))
  cases += [
      Case("linear_cross_entropy f32 params, bf16 compute grad",
           jax.grad(lce_mixed, argnums=(0, 1)), mixed_specs),
  ]
  # MobileNetV3's weight gradients with dy's column sum: a 1x1 expansion (the
  # per-tap dot) and a strided depthwise 3x3 (per-channel multiply-add).
  def wgrad(k, **window):
    return lambda x, dy: pk.conv2d_weight_grad(x, dy, k, column_sum=True,
                                               implementation="pallas", **window)
  cases += [
      Case("conv2d_weight_grad bf16 1x1", wgrad((1, 1)),
           (S((64, 56, 56, 24), bf), S((64, 56, 56, 72), bf))),
      Case("conv2d_weight_grad bf16 depthwise 3x3/2", wgrad((3, 3), stride=2, groups=72),
           (S((64, 56, 56, 72), bf), S((64, 28, 28, 72), bf))),
  ]
  # The same two with Adam's step on f32 state in place of dW (keras' Adam).
  def wadam(k, **window):
    return lambda x, dy, p, mu, nu, c: pk.conv2d_weight_grad(
        x, dy, k, param=p, mu=mu, nu=nu, count=c, learning_rate=1e-3,
        implementation="pallas", **window)
  count = S((), jnp.int32)
  cases += [
      Case("conv2d_weight_grad+adam bf16 1x1", wadam((1, 1)),
           (S((64, 56, 56, 24), bf), S((64, 56, 56, 72), bf)) + (S((1, 1, 24, 72), f32),) * 3
           + (count,)),
      Case("conv2d_weight_grad+adam bf16 depthwise 3x3/2",
           wadam((3, 3), stride=2, groups=72),
           (S((64, 56, 56, 72), bf), S((64, 28, 28, 72), bf)) + (S((3, 3, 1, 72), f32),) * 3
           + (count,)),
  ]
  # MobileNetV3's expansion: the previous batch norm and hard-swish applied on
  # load, bias, relu and the next batch norm's sums on the accumulator.
  conv = lambda x, w, sc, sh, b: pk.conv2d(
      x, w, scale=sc, shift=sh, prologue_activation="hard_swish", bias=b, activation="relu",
      statistics=True, implementation="pallas")
  cases += [
      Case("conv2d bf16 1x1 bn+act prologue, stats", conv,
           (S((64, 56, 56, 24), bf), S((1, 1, 24, 72), bf), S((24,), f32), S((24,), f32),
            S((72,), f32))),
      Case("conv2d bf16 depthwise 3x3/2",
           lambda x, w: pk.conv2d(x, w, stride=2, groups=72, activation="relu",
                                  implementation="pallas"),
           (S((64, 56, 56, 72), bf), S((3, 3, 1, 72), bf))),
  ]
  # MobileNetV3's batch norm with relu6: statistics, apply, and the backward
  # summing dbeta and dgamma where it reads the cotangent.
  bn = lambda x, g, b: pk.batch_norm(x, g, b, activation="relu6", implementation="pallas")[0]
  bn_specs = (S((64, 56, 56, 72), bf), S((72,), bf), S((72,), bf))
  cases += [
      Case("batch_norm relu6 bf16 fwd", bn, bn_specs),
      Case("batch_norm relu6 bf16 grad", grad(bn, (0, 1, 2)), bn_specs),
  ]
  # A diffusion UNet's group norm with silu (32 groups of 10 channels): the
  # forward's two walks, and the backward's sums and dx in one kernel.
  gn = lambda x, s, b: pk.group_norm(x, s, b, groups=32, activation="silu",
                                     implementation="pallas")
  gn_specs = (S((8, 64, 64, 320), bf), S((320,), bf), S((320,), bf))
  # The swap's calls before a pooled head: the forward summing y over H and
  # W instead of writing it; the backward's cotangent one row a sample, dx
  # summed for the convolution's bias.
  from pallas_kernels._src.ops.group_norm import api as gn_api  # noqa: PLC0415
  gn_bwd = lambda x, s, b, m, v, g: gn_api.group_norm_backward(  # noqa: E731
      x, s, b, m, v, g, groups=32, activation="silu", implementation="pallas", dx_sum=True)
  stat = S((8, 32), f32)
  cases += [
      Case("group_norm silu bf16 fwd", gn, gn_specs),
      Case("group_norm silu bf16 grad", grad(gn, (0, 1, 2)), gn_specs),
      Case("group_norm silu bf16 swap backward (row cotangent, dx sum)", gn_bwd,
           gn_specs + (stat, stat, S((8, 1, 1, 320), bf))),
      Case("group_norm silu bf16 swap forward (pooled)",
           lambda x, s, b: gn_api.group_norm_with_statistics(
               x, s, b, groups=32, activation="silu", implementation="pallas", pooled=True),
           gn_specs),
  ]
  return cases
