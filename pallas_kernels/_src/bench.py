"""`bench`: time any registered op's kernel against its XLA baseline.

Both implementations of a case run in the same process, on the same inputs,
each as one jitted function: `warmup` untimed calls (compilation included),
then `repeats` timed calls, each synchronised with `block_until_ready`; the
median is reported. From the op's cost model (`OpSpec.bytes_moved`,
`OpSpec.flops`) come achieved GB/s and TFLOP/s, and against `devices.py` the
percentage of the device's roofline. speedup = xla_time / kernel_time.

The XLA column times the same user-level computation as XLA gets it
(`OpSpec.baseline`: e.g. for quantized weights, dequantize to the compute dtype
and one dot at default precision, the epilogue in jnp), not the HIGHEST
precision validation reference. A row whose kernel call fell back to XLA has no
speed-up (`speedup` None, shown as "fell back"): it would time XLA against XLA.

Interpret mode runs the kernel as a slow emulation on the host: its timings
say nothing about the kernel, and the report says so (`interpret=True`, a
warning line in every rendering).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend
from pallas_kernels._src import devices
from pallas_kernels._src import guard
from pallas_kernels._src import registry
from pallas_kernels._src.spec import Case, OpSpec

INTERPRET_WARNING = ("WARNING: interpret mode - the Pallas kernel was emulated on the "
                     "host; these timings mean nothing about kernel performance.")


@dataclasses.dataclass(frozen=True, slots=True)
class BenchRow:
  """Timings and derived rates of one case."""

  op: str
  case: str
  dtype: str
  #: Median wall time per call, milliseconds.
  kernel_ms: float
  xla_ms: float
  #: xla_ms / kernel_ms (> 1: the kernel is faster); None when the kernel
  #: call fell back to XLA (no kernel was timed).
  speedup: float | None
  bytes_moved: int
  flops: int
  kernel_gbps: float
  xla_gbps: float
  kernel_tflops: float
  #: Achieved bandwidth as % of the device's peak HBM bandwidth (None: unknown device).
  kernel_pct_hbm: float | None
  xla_pct_hbm: float | None
  #: Achieved TFLOP/s as % of the device's peak for the case's dtype.
  kernel_pct_flops: float | None
  #: Guard fallback reasons hit by the kernel run (then it timed XLA).
  fallback: str | None
  #: The Pallas backend(s) the timed kernels were built with ("mosaic_gpu",
  #: "triton", "mosaic_gpu+triton"; "xla" when the call fell back).
  backend: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class BenchReport:
  """All rows of a `bench` run plus where and how it ran."""

  rows: tuple[BenchRow, ...]
  device: str
  #: Name of the `devices.DEVICES` entry used for rooflines, None if unknown.
  device_spec: str | None
  interpret: bool
  repeats: int
  warmup: int

  @property
  def timings_meaningful(self) -> bool:
    """False in interpret mode, where the kernel is emulated."""
    return not self.interpret

  @property
  def warning(self) -> str | None:
    """The line every rendering carries when the timings mean nothing
    (interpret mode); None when they are real."""
    return INTERPRET_WARNING if self.interpret else None

  def _header(self) -> list[str]:
    lines = [f"bench on {self.device} (roofline: {self.device_spec or 'unknown device'}), "
             f"median of {self.repeats} after {self.warmup} warm-up"]
    if self.warning:
      lines.append(self.warning)
    return lines

  def _cells(self) -> tuple[list[str], list[list[str]]]:
    header = ["op", "case", "backend", "kernel ms", "xla ms", "speedup", "MB", "kernel GB/s",
              "xla GB/s", "kernel %HBM", "xla %HBM", "kernel TFLOP/s", "%peak",
              "FALLBACK"]

    def pct(v):
      return "-" if v is None else f"{v:.1f}%"

    rows = [[r.op, r.case, r.backend or "-", f"{r.kernel_ms:.4f}", f"{r.xla_ms:.4f}",
             "fell back" if r.speedup is None else f"{r.speedup:.2f}x",
             f"{r.bytes_moved / 1e6:.1f}", f"{r.kernel_gbps:.1f}", f"{r.xla_gbps:.1f}",
             pct(r.kernel_pct_hbm), pct(r.xla_pct_hbm), f"{r.kernel_tflops:.3f}",
             pct(r.kernel_pct_flops), r.fallback or "-"] for r in self.rows]
    return header, rows

  def to_markdown(self) -> str:
    header, rows = self._cells()
    lines = self._header() + ["", "| " + " | ".join(header) + " |",
                              "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)

  def to_rows(self) -> list[dict[str, Any]]:
    """One plain dict per row (for results files)."""
    return [dataclasses.asdict(r) for r in self.rows]

  def to_json(self) -> str:
    """The whole report as JSON, the interpret flag and warning included."""
    return json.dumps({
        "device": self.device, "device_spec": self.device_spec,
        "interpret": self.interpret, "timings_meaningful": self.timings_meaningful,
        "warning": self.warning,
        "repeats": self.repeats, "warmup": self.warmup, "rows": self.to_rows(),
    }, indent=2)

  def __str__(self) -> str:
    header, rows = self._cells()
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = self._header()
    for k, row in enumerate(table):
      lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
      if k == 0:
        lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _median_seconds(fn, args, repeats: int, warmup: int) -> float:
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _bench_case(spec: OpSpec, case: Case, interpret: bool, repeats: int, warmup: int,
                device: devices.DeviceSpec | None, kernel_backend: str | None = None) -> BenchRow:
  kernel_kwargs = dict(case.kwargs)
  if kernel_backend is not None:
    kernel_kwargs["backend"] = kernel_backend

  def jitted(implementation: str):
    if implementation == "xla" and spec.baseline is not None:
      return jax.jit(lambda *args: spec.baseline(*args, **case.kwargs))
    kwargs = kernel_kwargs if implementation == "pallas" else case.kwargs
    return jax.jit(lambda *args: spec.fn(*args, implementation=implementation,
                                         interpret=interpret, **kwargs))

  guard.retrace_guards()  # Guards record fallbacks when traced: trace afresh.
  before = len(guard.fallbacks(spec.name))
  chosen = len(guard.choices(spec.name))
  kernel_s = _median_seconds(jitted("pallas"), case.args, repeats, warmup)
  reasons = []
  for f in guard.fallbacks(spec.name)[before:]:
    if f.reason not in reasons:
      reasons.append(f.reason)
  built = sorted({c.backend for c in guard.choices(spec.name)[chosen:]})
  built_text = "+".join(built) or ("xla" if reasons else "triton")
  xla_s = _median_seconds(jitted("xla"), case.args, repeats, warmup)

  nbytes, flops = int(spec.bytes_moved(case)), int(spec.flops(case))
  dtype = jnp.dtype(case.args[0].dtype).name
  kernel_gbps = nbytes / kernel_s / 1e9
  xla_gbps = nbytes / xla_s / 1e9
  kernel_tflops = flops / kernel_s / 1e12
  return BenchRow(
      op=spec.name, case=case.name, dtype=dtype, kernel_ms=kernel_s * 1e3,
      xla_ms=xla_s * 1e3, speedup=None if reasons else xla_s / kernel_s,
      bytes_moved=nbytes, flops=flops,
      kernel_gbps=kernel_gbps, xla_gbps=xla_gbps, kernel_tflops=kernel_tflops,
      kernel_pct_hbm=None if device is None else 100 * kernel_gbps / device.hbm_gbps,
      xla_pct_hbm=None if device is None else 100 * xla_gbps / device.hbm_gbps,
      kernel_pct_flops=None if device is None
      else 100 * kernel_tflops / device.peak_tflops(dtype),
      fallback="; ".join(reasons) or None, backend=built_text)


def bench(op: str | OpSpec | Sequence[str | OpSpec], *, tags: Sequence[str] = ("bench",),
          repeats: int = 20, warmup: int = 3, seed: int = 0,
          interpret: bool | None = None, kernel_backend: str | None = None) -> BenchReport:
  """Benchmarks op(s) against their XLA baseline over the cases of `tags`.

  Args:
    op: an op name, an `OpSpec`, or a sequence of either.
    tags: run the cases carrying any of these tags (each case once).
    repeats: timed calls per implementation and case (median reported).
    warmup: untimed calls first (the first one compiles).
    seed: seeds the random inputs.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU
      (and then the report flags its timings as meaningless).
    kernel_backend: build the kernels with this Pallas backend ("mosaic_gpu",
      "triton"; passed as `backend=` to ops that take it); None: the op's
      choice for the device. Each row names the backend it timed.

  Returns:
    A frozen `BenchReport`.

  Raises:
    ValueError: if `repeats` < 1, `warmup` < 0, or no case matches.
  """
  if repeats < 1 or warmup < 0:
    raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
  interp = backend.resolve_interpret(interpret)
  kind = backend.device_kind()
  device = devices.lookup(kind)
  rows = [_bench_case(spec, case, interp, repeats, warmup, device, kernel_backend)
          for spec, case in registry.select_cases(op, tags, seed)]
  if not rows:
    ops = [op] if isinstance(op, (str, OpSpec)) else list(op)
    raise registry.NoCasesError(f"no cases for ops {[getattr(o, 'name', o) for o in ops]} "
                                f"with tags {tuple(tags)}")
  return BenchReport(rows=tuple(rows), device=kind,
                     device_spec=None if device is None else device.name,
                     interpret=interp, repeats=repeats, warmup=warmup)
