"""Capture: compile a JAX function and keep everything XLA says about it.

`capture(fn, *args)` lowers and compiles `fn` (a `jax.jit` function, a plain
callable, a `Lowered` or a `Compiled`) and returns a `Capture`: the optimized
HLO text and parsed module, the pre-optimization HLO, cost and memory
analyses, platform and versions, and XLA's own buffer assignment.

No second compile: `Lowered.compile()` without options returns the executable
jit already built for these arguments (jax's compile cache; see `compat`), or
builds the one jit will run. XLA's buffer assignment then comes from that
executable's `serialized_buffer_assignment_proto`. XLA's live ranges exist
only in the text reports XLA writes when compiled with per-compile dump
options; `capture(..., xla_reports=True)` compiles once more to get them (and
the buffer assignment from the same reports, the files users get from
`XLA_FLAGS=--xla_dump_to` on GPU and TPU). `Capture.xla_memory_source` says
which source was used.

`capture(fn, *args, target="h200")` compiles for a GPU this machine need
not have, through a compile-only topology (target/target.py): the arguments
get the target's shardings and the executable is XLA:GPU's (it carries no
serialized buffer assignment; `memory_analysis()` stands in).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import shutil
import tempfile
import types
from collections.abc import Callable, Mapping
from typing import Any

from hlo_audit._src import compat
from hlo_audit._src.capture.dump import read_dump_dir
from hlo_audit._src.capture.result import Capture as Capture
from hlo_audit._src.capture.result import MemoryStats as MemoryStats
from hlo_audit._src.errors import CaptureError, TargetError
from hlo_audit._src.hlo.buffer_assignment_proto import (
    ProtoError, allocated_bytes, parse_buffer_assignment_proto)
from hlo_audit._src.hlo.parser import parse_hlo
from hlo_audit._src.hlo.xla_reports import (BufferAssignment, parse_buffer_assignment,
                                            parse_live_range)
from hlo_audit._src.target import wheels
from hlo_audit._src.target.target import Target, resolve_target


def capture(fn: Any, *args: Any, xla_reports: bool = False,
            target: str | os.PathLike | Target | None = None,
            **kwargs: Any) -> Capture:
  """Compiles `fn` for `args` and captures what XLA made of it.

  Compiles at most once: when jit already compiled `fn` for these argument
  types, its executable is reused; otherwise the executable built here is
  the one jit will run. With `target`, it compiles for that device instead
  of this machine's (no GPU needed: see `hlo_audit.get_target`).

  Args:
    fn: a `jax.jit`-wrapped function (its static and donated arguments are
      honoured), a plain callable (jitted here), a `jax.stages.Lowered`, or a
      `jax.stages.Compiled`.
    *args: arguments: arrays, `jax.ShapeDtypeStruct`s, or pytrees of them (none
      for `Lowered` and `Compiled`).
    xla_reports: also compile once more with per-compile dump options and
      read XLA's buffer-assignment and live-range reports (live ranges exist
      nowhere else). Not for a `Compiled`.
    target: the device to compile for: a name ("h200", "h100", "b200": see
      `hlo_audit.list_targets`), a `GpuTargetConfigProto` text file, or a
      `hlo_audit.Target` (several GPUs, autotune results). The arguments
      get the target's shardings (`Target.place`). Not for a `Lowered` or
      `Compiled`: they are lowered for their devices already.
    **kwargs: keyword arguments of `fn`.

  Returns:
    The capture. Its XLA buffer assignment comes from the executable
    (`xla_memory_source` says from where); its live ranges only with
    `xla_reports=True`.

  Raises:
    CaptureError: if `fn` is not a function or stage, cannot be traced with
      these arguments, or fails to compile; the message names the problem.
    TargetError: for an unknown target, or missing plugin wheels (the
      message names the pip command).
  """
  return start_capture(fn, *args, xla_reports=xla_reports, target=target,
                       **kwargs).result()


@dataclasses.dataclass(frozen=True, slots=True)
class PendingCapture:
  """A capture whose module is parsed while XLA's memory and cost analyses
  of the executable still run on a second thread.

  `partial` holds everything but those analyses (the module, its text, the
  platform, the argument names): an audit reads them first, and asks
  `result()`, which waits for XLA, only for the facts XLA's analyses give
  (its peak, cost, buffer assignment).
  """

  partial: Capture
  _finish: Callable[[], Capture] = dataclasses.field(repr=False)

  def result(self) -> Capture:
    """The whole capture (waits for XLA's analyses)."""
    return self._finish()

  def with_changes(self, **changes: Any) -> PendingCapture:
    """This capture with `changes` to its fields, now and in `result()`."""
    finish = self._finish
    return PendingCapture(dataclasses.replace(self.partial, **changes),
                          functools.cache(lambda: dataclasses.replace(finish(), **changes)))


def start_capture(fn: Any, *args: Any, xla_reports: bool = False,
                  target: str | os.PathLike | Target | None = None,
                  **kwargs: Any) -> PendingCapture:
  """`capture`, returning as soon as the module is parsed (see
  `PendingCapture`); the arguments and errors are `capture`'s."""
  import jax  # Imported here: parsing HLO text must not need JAX.
  from jax import stages

  target = resolve_target(target)
  fn = _jax_stage(fn, (stages.Lowered, stages.Compiled))
  if target is not None and isinstance(fn, (stages.Lowered, stages.Compiled)):
    raise CaptureError(f"a {type(fn).__name__} stage is lowered for its devices already: "
                       f"pass the function and its arguments with target={target.name!r}")
  if isinstance(fn, stages.Compiled):
    if args or kwargs:
      raise CaptureError("a Compiled stage takes no arguments: capture(compiled)")
    if xla_reports:
      raise CaptureError("a Compiled stage cannot be compiled again with dump "
                         "options: pass the function or its Lowered for "
                         "xla_reports=True")
    return _from_compiled(fn, origin="compiled")
  if isinstance(fn, stages.Lowered):
    if args or kwargs:
      raise CaptureError("a Lowered stage takes no arguments: capture(lowered)")
    return _compile_and_capture(fn, origin="lowered", xla_reports=xla_reports)
  if isinstance(fn, stages.Wrapped) or hasattr(fn, "lower"):
    jitted, origin = fn, "jit"
  elif callable(fn):
    jitted, origin = jax.jit(fn), "jit"
  else:
    raise CaptureError(
        f"capture expects a function, a jax.jit-wrapped function, a Lowered or "
        f"a Compiled; got {type(fn).__name__}")
  name = getattr(fn, "__name__", type(fn).__name__)
  try:
    if target is None:
      lowered = _jax_stage(jitted.lower(*args, **kwargs), stages.Lowered)
    else:
      placed, placed_kwargs = target.place(args, kwargs)
      with target.lowering():
        lowered = _jax_stage(jitted.lower(*placed, **placed_kwargs), stages.Lowered)
  except (CaptureError, TargetError):
    raise
  except Exception as e:  # JAX raises TypeError, ValueError, tracer errors...
    raise CaptureError(f"could not trace {name}{_signature(args, kwargs)}"
                       f"{' for ' + target.label if target else ''}: "
                       f"{type(e).__name__}: {_first_line(e)}") from e
  pending = _compile_and_capture(lowered, origin=origin, xla_reports=xla_reports,
                                 options=target.compiler_options() if target else None)
  return pending.with_changes(argument_names=_argument_names(fn), target=target)


def _argument_names(fn) -> tuple[str, ...]:
  """Positional parameter names of `fn` (through jax.jit's wrapper)."""
  import inspect

  raw = fn
  while hasattr(raw, "__wrapped__"):
    raw = raw.__wrapped__
  try:
    sig = inspect.signature(raw)
  except (TypeError, ValueError):
    return ()
  names = []
  for p in sig.parameters.values():
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
      names.append(p.name)
    elif p.kind is p.VAR_POSITIONAL:
      names.append("*" + p.name)
      break
  return tuple(names)


def _jax_stage(obj: Any, kind) -> Any:
  """JAX's own stage inside a library's wrapper (equinox's `filter_jit`
  returns a Lowered/Compiled of its own holding JAX's as `.lowered` or
  `.compiled`), else `obj` unchanged."""
  for attr in ("lowered", "compiled"):
    inner = getattr(obj, attr, None)
    if not isinstance(obj, kind) and isinstance(inner, kind):
      return inner
  return obj


def _compile_and_capture(lowered, *, origin: str, xla_reports: bool,
                         options: dict[str, str] | None = None) -> PendingCapture:
  pre = _lazy_pre_optimization(lowered)
  try:
    # No options: jax's cache returns the executable jit built (or will run).
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
  except Exception as e:
    raise CaptureError(f"XLA failed to compile: {type(e).__name__}: "
                       f"{_first_line(e)}") from e
  if not xla_reports:
    return _from_compiled(compiled, origin=origin, pre=pre)
  return _with_dump_reports(lowered, compiled, origin=origin, pre=pre, options=options)


def _lazy_pre_optimization(lowered) -> Callable[[], str | None]:
  return lambda: lowered.as_text(dialect="hlo")


def _with_dump_reports(lowered, compiled, *, origin: str, pre,
                       options: dict[str, str] | None = None) -> PendingCapture:
  """Compiles again with per-compile dump options (a second compile: the
  options are part of jax's cache key) and reads XLA's reports; the module
  and analyses stay those of `compiled`, the executable jit runs."""
  dump_dir = tempfile.mkdtemp(prefix="hlo_audit_")
  notes: list[str] = []
  try:
    dump = {**(options or {}), "xla_dump_to": dump_dir, "xla_dump_hlo_as_text": True}
    try:
      lowered.compile(compiler_options=dump)
    except TypeError:
      notes.append("this JAX cannot pass per-compile dump options; XLA's "
                   "live ranges are unavailable")
    except Exception as e:
      raise CaptureError(f"XLA failed to compile: {type(e).__name__}: "
                         f"{_first_line(e)}") from e
    dumped = [m for m in read_dump_dir(dump_dir) if m.after_optimizations]
    if not dumped and not notes:
      notes.append(_no_reports_note())
    pending = _from_compiled(compiled, origin=origin,
                             dumped=dumped[-1] if dumped else None,
                             pre=pre, notes=notes)
    pending.result()  # the reports are read before their folder goes
    return pending
  finally:
    shutil.rmtree(dump_dir, ignore_errors=True)


def _no_reports_note() -> str:
  cache = compat.persistent_cache_dir()
  # A cache hit still dumps the optimized module, but not the reports that
  # XLA writes while it compiles.
  return "XLA wrote no dump reports: its live ranges are unavailable" + (
      f" (JAX's persistent compilation cache, {cache}, gave the dump compile an "
      "executable compiled before, and XLA writes its reports only when it "
      "compiles: audit without jax_compilation_cache_dir set)" if cache else "")


def _from_compiled(compiled, *, origin: str, dumped=None, pre=None,
                   notes=None) -> PendingCapture:
  import jax
  import jaxlib

  notes = list(notes or [])
  text = compiled.as_text()
  if not text:
    raise CaptureError("the compiled executable has no HLO text")
  device = _device(compiled)
  # XLA's memory analysis (a fifth of a second on a 30k-instruction module,
  # most of it serializing the buffer assignment) runs in C++ without the
  # GIL: asked on a second thread, it overlaps the parse and the analyses
  # until the audit reads XLA's peak (`PendingCapture.result`). Nothing
  # else asks the executable anything until then.
  pool = concurrent.futures.ThreadPoolExecutor(1, "hlo_audit-xla-analyses")
  analyses = pool.submit(lambda: (_raw_memory(compiled), _cost(compiled)))
  pool.shutdown(wait=False)  # the thread ends with its one task
  if dumped is None and pre is not None:
    lowered_text = pre
    # Converting the lowered module waits for XLA's analyses: jaxlib is
    # asked one thing at a time.
    pre = lambda: (analyses.result(), lowered_text())[1]  # noqa: E731
  try:
    module = parse_hlo(text, source=f"<optimized HLO of {origin}>")
  except BaseException:
    analyses.cancel()
    raise
  platform = device.platform if device is not None else jax.default_backend()
  partial = Capture(
      module=module, hlo_text=text, pre_optimization=pre, platform=platform,
      device_kind=device.device_kind if device is not None else "",
      jax_version=jax.__version__, jaxlib_version=jaxlib.__version__,
      # XLA:TPU is the installed libtpu, a target's compile-only one included.
      libtpu_version=(wheels.libtpu_version() or "") if platform == "tpu" else "",
      origin=origin, notes=tuple(notes))

  @functools.cache
  def finish() -> Capture:
    raw_memory, cost = analyses.result()
    buffer_assignment = live_range = report = None
    source = ""
    more = list(notes)
    pre_text = partial.pre_optimization
    if dumped is not None:
      buffer_assignment = dumped.read_buffer_assignment()
      live_range = dumped.read_live_range()
      report = dumped.read_memory_usage_report()
      source = "dump reports" if buffer_assignment is not None else ""
      if buffer_assignment is None:
        more.append(_no_reports_note())
      if pre_text is None:
        pre_text = dumped.read_before_optimizations
    allocated = None
    if buffer_assignment is None:
      buffer_assignment, allocated = _proto_buffer_assignment(compiled, raw_memory, more)
      if buffer_assignment is not None:
        source = "buffer-assignment proto"
    return dataclasses.replace(
        partial, pre_optimization=pre_text, cost_analysis=cost,
        memory_stats=_memory(raw_memory), xla_buffer_assignment=buffer_assignment,
        xla_allocated_bytes=allocated, live_range=live_range,
        memory_usage_report=report, xla_memory_source=source, notes=tuple(more))

  return PendingCapture(partial, finish)


def _proto_buffer_assignment(compiled, raw_memory, notes):
  """(a function making XLA's buffer assignment, its allocated bytes) from the
  executable itself, or (None, None), noted. The allocations' sizes are read
  now, which also checks the proto; naming the values waits for a reader."""
  proto = compat.buffer_assignment_proto(raw_memory)
  if proto is None:
    notes.append("this executable carries no serialized buffer assignment: "
                 "XLA's peak comes from memory_analysis()")
    return None, None
  try:
    allocated = allocated_bytes(proto)
  except ProtoError as e:
    notes.append(f"XLA's serialized buffer assignment could not be read ({e}): "
                 "XLA's peak comes from memory_analysis()")
    return None, None

  def decode() -> BufferAssignment | None:
    try:
      return parse_buffer_assignment_proto(proto, compat.hlo_module_proto(compiled))
    except ProtoError:
      return None  # the sizes read above were whole: only names can be at fault

  return decode, allocated


def _device(compiled):
  """A device the executable was compiled for, from its shardings (pytrees
  of them: a train step's first argument is a dict of parameters)."""
  import jax

  try:
    for s in jax.tree.leaves((compiled.input_shardings, compiled.output_shardings)):
      devices = getattr(s, "device_set", None)
      if devices:
        return next(iter(devices))
  except Exception:  # noqa: BLE001 - best effort; fall back to the default
    pass
  return jax.devices()[0]


def _cost(compiled) -> Mapping[str, float] | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001 - some backends do not implement it
    return None
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per device
    cost = cost[0] if cost else None
  if not cost:
    return None
  return types.MappingProxyType({str(k): float(v) for k, v in cost.items()})


def _raw_memory(compiled):
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - some backends do not implement it
    return None
  if isinstance(m, (list, tuple)):
    m = m[0] if m else None
  return m


def _memory(m) -> MemoryStats | None:
  if m is None:
    return None
  if isinstance(m, (list, tuple)):
    m = m[0] if m else None
    if m is None:
      return None
  get = lambda name: int(getattr(m, name, 0) or 0)  # noqa: E731
  peak = getattr(m, "peak_memory_in_bytes", None)
  return MemoryStats(
      argument_bytes=get("argument_size_in_bytes"),
      output_bytes=get("output_size_in_bytes"),
      alias_bytes=get("alias_size_in_bytes"),
      temp_bytes=get("temp_size_in_bytes"),
      generated_code_bytes=get("generated_code_size_in_bytes"),
      peak_bytes=int(peak) if peak is not None else None,
      host_argument_bytes=get("host_argument_size_in_bytes"),
      host_output_bytes=get("host_output_size_in_bytes"),
      host_temp_bytes=get("host_temp_size_in_bytes"))


def capture_text(text: str, *, source: str | None = None,
                 buffer_assignment: str | None = None,
                 live_range: str | None = None) -> Capture:
  """A capture of HLO text alone (a file, a string), optionally with XLA's
  buffer assignment and live-range report texts."""
  module = parse_hlo(text, source=source)
  assignment = parse_buffer_assignment(buffer_assignment) if buffer_assignment else None
  return Capture(
      module=module, hlo_text=text, origin="text", path=source,
      xla_buffer_assignment=assignment,
      live_range=parse_live_range(live_range) if live_range else None,
      xla_memory_source="dump reports" if buffer_assignment else "",
      notes=("HLO text alone: no XLA buffer assignment or live ranges",)
      if buffer_assignment is None else ())


def _signature(args, kwargs) -> str:
  try:
    import jax
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    parts = []
    for leaf in leaves[:6]:
      shape = getattr(leaf, "shape", None)
      dtype = getattr(leaf, "dtype", None)
      parts.append(f"{dtype}{list(shape)}" if shape is not None else type(leaf).__name__)
    more = ", ..." if len(leaves) > 6 else ""
    return "(" + ", ".join(parts) + more + ")"
  except Exception:  # noqa: BLE001 - only for the message
    return "(...)"


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__
