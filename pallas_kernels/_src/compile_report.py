"""Compile the Mosaic GPU kernels for an H200 on a CPU: ptxas's own report.

Each case is compiled through XLA for a compile-only H200 topology
(`topology.py`: the CUDA plugin wheels and `nvidia-cuda-nvcc-cu12`), the
kernels built for that target (`backend.targeting`). Mosaic GPU dumps what it
compiles when `MOSAIC_GPU_DUMP_TO`/`_PTX`/`_PTXAS` are set: per kernel its
PTX (`.target sm_90a`, the `wgmma.mma_async` instructions counted here),
ptxas's `-v` lines (registers per thread, spill stores and loads) and its
resources (`smem_scratch_bytes`: the dynamic shared memory it allocates).
Nothing runs; nothing here says how fast a kernel is.

`jax_reference_cases` compiles JAX's own `hopper_matmul_mgpu` at its
benchmark configuration on the same shapes, the yardstick for ours.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import glob
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend
from pallas_kernels._src import guard
from pallas_kernels._src.audit import topology

#: The compile target and its opt-in shared memory per block (the H200's
#: `shared_memory_per_block_optin` in its GpuTargetConfigProto: 227 KiB).
ARCH = "sm_90a"
SMEM_LIMIT = 232448
_DUMP_ENV = ("MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_PTX", "MOSAIC_GPU_DUMP_PTXAS")


@dataclasses.dataclass(frozen=True, slots=True)
class KernelStats:
  """What ptxas and Mosaic GPU say about one compiled kernel."""

  case: str
  #: The kernel's name in the dump, in launch order within the case.
  kernel: str
  #: The tiling it was built with, e.g. "128x128x64 s4 wg2:n".
  config: str
  registers: int
  spill_stores: int
  spill_loads: int
  #: Dynamic shared memory, bytes; None where Mosaic GPU wrote no resources
  #: file (it writes them only to the dump folder of the process's first
  #: Mosaic GPU compile: `python -m pallas_kernels compile-report` runs in a
  #: process of its own).
  shared: int | None
  #: `wgmma.mma_async` instructions in the PTX.
  wgmma: int

  @property
  def spills(self) -> int:
    return self.spill_stores + self.spill_loads

  @property
  def fits(self) -> bool:
    return self.spills == 0 and self.shared is not None and self.shared <= SMEM_LIMIT


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
  """One call to compile: a name, the function, its argument specs, and the
  configuration to print for kernels whose name does not carry theirs."""

  name: str
  fn: Callable[..., Any]
  specs: tuple[jax.ShapeDtypeStruct, ...]
  configs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
  rows: tuple[KernelStats, ...]
  #: (case, reason) for each fallback or non-Mosaic kernel choice recorded.
  notes: tuple[tuple[str, str], ...] = ()
  #: (case, error) for each case that did not compile.
  errors: tuple[tuple[str, str], ...] = ()
  #: Kernels whose SASS Mosaic GPU could not list (its dump runs nvdisasm,
  #: which the nvcc wheel lacks), and the first reason given; nothing here
  #: reads SASS, so the report is whole without it.
  sass_skipped: int = 0
  sass_reason: str = ""

  @property
  def fits(self) -> bool:
    return bool(self.rows) and not self.errors and all(r.fits for r in self.rows)


def config_text(cfg: Any) -> str:
  """"128x128x64 s4 wg2:n"-style summary of a `MosaicConfig` (or JAX's
  `TuningConfig`: warpgroups along N or M, two of them)."""
  stages = getattr(cfg, "stages", getattr(cfg, "max_concurrent_steps", 0))
  wgs = getattr(cfg, "compute_wgs", 2)
  dim = str(getattr(cfg, "wg_dimension", "n")).lower()
  return f"{cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k} s{stages} wg{wgs}:{dim}"


_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"smem_scratch_bytes=(\d+)")
#: Our kernels' names carry their tiling (`mosaic_gpu.kernel_name`).
_NAMED = re.compile(r"matmul_(\d+)x(\d+)x(\d+)_s(\d+)_wg(\d)([mn])")


def _read(path: str) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()


def _stats(case: str, dump: str, configs: Sequence[str],
           seen: set[str]) -> list[KernelStats]:
  """Stats of the kernels dumped since `seen` (which it then includes)."""
  rows = []
  ptxs = sorted((p for p in glob.glob(os.path.join(dump, "*.ptx")) if p not in seen),
                key=os.path.getmtime)
  seen.update(ptxs)
  for i, ptx in enumerate(ptxs):
    base = ptx[:-len(".ptx")]
    tiling = _NAMED.search(os.path.basename(base))
    if tiling:
      m, n, k, stages, wgs, dim = tiling.groups()
      config = f"{m}x{n}x{k} s{stages} wg{wgs}:{dim}"
    else:
      config = configs[i] if i < len(configs) else "-"
    log = _read(base + ".ptxas") if os.path.exists(base + ".ptxas") else ""
    res = _read(base + ".resources.txt") if os.path.exists(base + ".resources.txt") else ""
    spills = [(int(a), int(b)) for a, b in _SPILL.findall(log)]
    rows.append(KernelStats(
        case=case, kernel=os.path.basename(base),
        config=config,
        registers=max((int(r) for r in _REGS.findall(log)), default=0),
        spill_stores=max((a for a, _ in spills), default=0),
        spill_loads=max((b for _, b in spills), default=0),
        shared=max((int(s) for s in _SMEM.findall(res)), default=None),
        wgmma=len(re.findall(r"wgmma\.mma_async", _read(ptx)))))
  return rows


@functools.cache
def _dump_folder() -> str:
  """One dump folder per process: Mosaic GPU keeps writing some of a
  kernel's files (its resources) to the folder it first dumped to, so a
  second report in a fresh folder would find them missing."""
  dump = tempfile.mkdtemp(prefix="mosaic_dump_")
  atexit.register(shutil.rmtree, dump, ignore_errors=True)
  return dump


@contextlib.contextmanager
def _dumping() -> Any:
  dump = _dump_folder()
  saved = {k: os.environ.get(k) for k in _DUMP_ENV}
  os.environ.update(MOSAIC_GPU_DUMP_TO=dump, MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_PTXAS="1")
  try:
    yield dump
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


#: What Mosaic GPU's dump prints, straight to file descriptor 2, for each
#: kernel whose SASS it could not list: the failure, then a source-location
#: trace of jaxlib's (lines `file:line`) and a blank line.
_NVDISASM = re.compile(r"^nvdisasm invocation failed: *(?P<why>[^\n]*)\n"
                       r"(?:=== Source Location Trace: ===[^\n]*\n(?:[^\n\s]+:\d+[^\n]*\n)*)?"
                       r"\n?", re.MULTILINE)


def nvdisasm_failures(text: str) -> tuple[str, int, str]:
  """`text` (what native code wrote to stderr) without Mosaic GPU's nvdisasm
  failures; how many there were, and the first one's reason."""
  found = [m.group("why").strip() for m in _NVDISASM.finditer(text)]
  return _NVDISASM.sub("", text), len(found), (found[0] if found else "")


@contextlib.contextmanager
def _native_stderr() -> Any:
  """Captures what is written to file descriptor 2 (native code writes
  there, past `sys.stderr`) into the list it yields, as one string once the
  block ends."""
  sink: list[str] = []
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield sink
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      sink.append(tmp.read().decode("utf-8", errors="replace"))


def compile_case(case: Case, dump: str,
                 seen: set[str]) -> tuple[list[KernelStats], list[tuple[str, str]]]:
  """Compiles one case for the H200 topology: its kernels' stats (from the
  files it adds to `dump`), and the fallbacks or Triton choices recorded
  while building it."""
  h200 = backend.target_of_device(topology.device(ARCH))
  notes = []
  with guard.collect_fallbacks() as records:
    with backend.targeting(h200):
      topology.compile_for(ARCH, case.fn, *case.specs)
    rows = _stats(case.name, dump, case.configs, seen)
  notes += [(case.name, f"fell back to XLA: {f.reason}") for f in records]
  notes += [(case.name, f"{c.backend}: {c.why}") for c in records.choices
            if c.backend != "mosaic_gpu"]
  return rows, notes


def report(cases: Sequence[Case]) -> Report:
  """Stats of every Mosaic GPU kernel of every case (a case that does not
  compile is kept as an error, with the first line of its message)."""
  rows, notes, errors = [], [], []
  with _dumping() as dump, _native_stderr() as native:
    seen = set(glob.glob(os.path.join(dump, "*.ptx")))  # earlier reports' kernels
    for case in cases:
      try:
        r, n = compile_case(case, dump, seen)
      except Exception as e:  # noqa: BLE001 - reported, and fails the report.
        errors.append((case.name, f"{type(e).__name__}: {str(e).splitlines()[0]}"))
        seen.update(glob.glob(os.path.join(dump, "*.ptx")))
        continue
      rows += r
      notes += n
  # Everything else the compiles said goes on to stderr, as it came.
  rest, skipped, reason = nvdisasm_failures("".join(native))
  if rest:
    sys.stderr.write(rest)
    sys.stderr.flush()
  return Report(tuple(rows), tuple(notes), tuple(errors), skipped, reason)


def format_table(rows: Sequence[KernelStats]) -> str:
  """A fixed-width table, one line per compiled kernel."""
  head = (f"{'case':<44} {'kernel':<14} {'config':<20} {'regs':>4} {'spill st/ld B':>13} "
          f"{'smem B':>7} {'wgmma':>5} fits")
  lines = [head, "-" * len(head)]
  for r in rows:
    spill = f"{r.spill_stores}/{r.spill_loads}"
    lines.append(f"{r.case:<44} {r.kernel:<14} {r.config:<20} {r.registers:>4} {spill:>13} "
                 f"{'?' if r.shared is None else r.shared:>7} {r.wgmma:>5} {'yes' if r.fits else 'NO'}")
  return "\n".join(lines)


# ------------------------------------------------------------------ cases ----

S = jax.ShapeDtypeStruct
_BF, _F32 = jnp.bfloat16, jnp.float32


def _mm(**kw):
  import pallas_kernels as pk  # noqa: PLC0415 - cases import the package lazily.
  return lambda x, w, *rest: pk.matmul(x, w, implementation="pallas", backend="mosaic_gpu",
                                       **dict(zip(("bias", "residual"), rest)), **kw)


def default_cases() -> list[Case]:
  """Every Mosaic GPU kernel at its default config: JAX's benchmark shapes
  (bf16 4096^3, 8192x512x8192 with the bias+GELU+residual epilogue of docs/ops.md),
  each dtype path of the prologue, the quantizing epilogue, and the
  backward's dx and dw."""
  m, k, n = 8192, 512, 8192
  epi = (S((m, k), _BF), S((k, n), _BF), S((n,), _BF), S((m, n), _BF))

  def grad(f, argnums):
    return jax.grad(lambda *a: f(*a).astype(_F32).sum(), argnums=argnums)

  cases = [
      ("matmul bf16 4096^3", _mm(), (S((4096, 4096), _BF), S((4096, 4096), _BF))),
      ("matmul bf16 8192x512x8192 bias+gelu+res", _mm(activation="gelu"), epi),
      ("matmul f16 4096^3 bias+silu", _mm(activation="silu"),
       (S((4096, 4096), jnp.float16), S((4096, 4096), jnp.float16),
        S((4096,), jnp.float16))),
      ("matmul f32 tf32 w[N,K] bias+gelu (out bf16)",
       lambda x, w, b: _mm(activation="gelu", precision="default", out_dtype=_BF,
                           transpose_w=True)(x, w, b),
       (S((4096, 4096), _F32), S((4096, 4096), _F32), S((4096,), _F32))),
      ("matmul bf16 grad bias+gelu+res (fwd,dx,dw)",
       grad(_mm(activation="gelu"), (0, 1, 2, 3)), epi),
  ]
  for label, wdt, group, tw in (("int8", jnp.int8, None, False),
                                ("int4 g128", jnp.int4, 128, False),
                                ("fp8", jnp.float8_e4m3fn, None, False),
                                ("int8 transpose_w", jnp.int8, None, True)):
    wshape = (n, k) if tw else (k, n)
    sshape = (k // group, n) if group else (n,)
    fn = (lambda group, tw: lambda x, w, s, b: _mm(
        w_scale=s, w_group_size=group, transpose_w=tw, activation="gelu")(x, w, b))(group, tw)
    cases.append((f"matmul bf16 x {label} w bias+gelu", fn,
                  (S((m, k), _BF), S(wshape, wdt), S(sshape, _F32), S((n,), _BF))))
  cases += [
      ("matmul int8 x int8 w[N,K] (row, channel scales)",
       lambda x, w, xs, ws: _mm(x_scale=xs, w_scale=ws, out_dtype=_BF, transpose_w=True)(x, w),
       (S((m, k), jnp.int8), S((n, k), jnp.int8), S((m,), _F32), S((n,), _F32))),
      ("matmul fp8 x fp8 w[N,K] (row, channel scales)",
       lambda x, w, xs, ws: _mm(x_scale=xs, w_scale=ws, out_dtype=_BF, transpose_w=True)(x, w),
       (S((m, k), jnp.float8_e4m3fn), S((n, k), jnp.float8_e4m3fn), S((m,), _F32),
        S((n,), _F32))),
      ("matmul bf16 decode m=16 x int8 w",
       lambda x, w, s: _mm(w_scale=s)(x, w),
       (S((16, 8192), _BF), S((8192, 8192), jnp.int8), S((8192,), _F32))),
      ("matmul bf16 quantize=int8 n=256",
       lambda x, w, b: _mm(activation="gelu", quantize="int8")(x, w, b),
       (S((m, k), _BF), S((k, 256), _BF), S((256,), _BF))),
  ]
  return [Case(name, fn, specs) for name, fn, specs in cases]


#: JAX's `hopper_matmul_mgpu` benchmark configuration (its `main`'s sweep at
#: 128x128x64, 4 stages, 64x64 epilogue, warpgroups along N).
JAX_CONFIG = dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                  epi_tile_m=64, epi_tile_n=64)


def jax_reference_cases() -> list[Case]:
  """JAX's own Hopper matmul at its configuration, on the comparison shapes."""
  from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm  # noqa: PLC0415
  cfg = hm.TuningConfig(**JAX_CONFIG)

  def jax_mm(a, b):
    return hm.matmul(a, b, None, cfg)

  text = config_text(cfg)
  return [Case("JAX hopper_matmul_mgpu bf16 4096^3", jax_mm,
               (S((4096, 4096), _BF), S((4096, 4096), _BF)), (text,)),
          Case("JAX hopper_matmul_mgpu bf16 8192x512x8192", jax_mm,
               (S((8192, 512), _BF), S((512, 8192), _BF)), (text,))]
