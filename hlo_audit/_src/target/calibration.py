"""This machine's CPU, measured: the device facts of XLA:CPU here.

A CPU has no datasheet XLA reads, and its rates depend on the cores a
process gets, the caches and XLA:CPU's kernels (YNNPACK, Eigen, its own loop
emitter). So the facts are measured once per machine and jax version, with
small programs run under JAX's profiler (`profile.py`: the kernels' own
times, without Python's dispatch), in three passes over them all (medians
of nine runs each):

- launch overhead: a chain of 64 tiny dependent dots (8x8; dots never fuse
  with each other), the step's span over 64;
- memory bandwidth, by working set: one elementwise kernel updating f32
  arrays of 16 KiB to 64 MiB in place (a program's buffers are reused:
  fresh pages would cost their faults); the smallest of them XLA:CPU splits
  over threads, less their bytes, give what the split adds;
- strided access: the median of five transposes that move the minor
  dimension;
- matrix FLOP/s: the median of nine f32 and bf16 dots of layer-like shapes;
  the same f32 dots with a transposed operand give the library's transposed
  variant and XLA:CPU's own Eigen dots (the larger ones: a small one is its
  hand-off to the thread pool); 128x512xK dots, how narrow contractions slow;
- vector FLOP/s: 32 fused multiply-adds per element; transcendentals: 16
  fused exps per element;
- reductions: a row sum (a library kernel) and an argmax (XLA:CPU's loop
  emitter, one element at a time).

The result is cached as JSON (`cache_path()`; `$HLO_AUDIT_CACHE_DIR` moves
it) and measured again by `hlo-audit calibrate` or `cpu_facts(
recalibrate=True)`. About five seconds.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import pathlib
import platform
import statistics
import threading
import types
from collections.abc import Sequence

from hlo_audit._src.errors import TargetError
from hlo_audit._src.target.devices import DeviceFacts

#: Where cached facts live unless $HLO_AUDIT_CACHE_DIR says.
DEFAULT_CACHE_DIR = "~/.cache/hlo-audit"
CACHE_ENV = "HLO_AUDIT_CACHE_DIR"
#: Bump when what is measured changes: older caches are measured again.
VERSION = 1

#: Elements per array of the streaming kernels (f32: 16 KiB to 64 MiB; the
#: middle ones straddle the size from which XLA:CPU splits a kernel).
_BANDWIDTH_SIZES = (4096, 16384, 65536, 98304, 131072, 262144, 1048576, 4194304,
                    16777216)
#: f32 transposes that move the minor dimension, and their permutations
#: (sizes a program has: power-of-two squares of a MiB and more hit cache
#: conflicts that make them ten times slower still).
_TRANSPOSES = (((384, 512), (1, 0)), ((640, 768), (1, 0)), ((8, 32, 32, 32), (3, 1, 2, 0)),
               ((16, 64, 128), (2, 0, 1)), ((256, 8, 128), (1, 2, 0)))
#: The argmax's rows and columns, and the row sum's.
_ARGMAX = (1024, 512)
_ROWSUM = (1024, 256)
_CHAIN = 64
_VECTOR_ELEMENTS = 256 * 1024
_FMAS = 32
_EXPS = 16

_lock = threading.Lock()
_facts: DeviceFacts | None = None


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo on Linux), else the platform's word."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown CPU"


def cores() -> int:
  """Cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def machine_key() -> dict:
  """What the facts depend on: a change of any measures again."""
  import jax
  import jaxlib

  return {"version": VERSION, "cpu": cpu_name(), "cores": cores(),
          "machine": platform.machine(), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__}


def cache_path(key: dict | None = None) -> pathlib.Path:
  """The JSON file holding this machine's facts."""
  key = machine_key() if key is None else key
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  root = os.environ.get(CACHE_ENV) or os.path.expanduser(DEFAULT_CACHE_DIR)
  return pathlib.Path(root) / f"cpu-facts-{digest}.json"


def cpu_facts(*, recalibrate: bool = False) -> DeviceFacts:
  """This machine's CPU facts: from the cache, else measured (and cached)."""
  global _facts
  with _lock:
    if _facts is not None and not recalibrate:
      return _facts
    key = machine_key()
    path = cache_path(key)
    facts = None if recalibrate else _load(path, key)
    if facts is None:
      facts = measure()
      _save(path, key, facts)
    _facts = facts
    return facts


def _load(path: pathlib.Path, key: dict) -> DeviceFacts | None:
  try:
    doc = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  if not isinstance(doc, dict) or doc.get("key") != key:
    return None
  try:
    return DeviceFacts.from_dict(doc["facts"])
  except (TargetError, KeyError, TypeError):
    return None  # a cache written by another version: measure again


def _save(path: pathlib.Path, key: dict, facts: DeviceFacts) -> None:
  """Writes the cache; an unwritable cache directory only costs a re-measure."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "facts": facts.to_dict()}, indent=1),
                   encoding="utf-8")
    os.replace(tmp, path)
  except OSError:
    pass


# -------------------------------------------------------------- measure ----

#: Matmul shapes (M, N, K) whose median rate is the matrix rate: the mix of
#: sizes and aspect ratios real layers have (a single large square dot runs
#: far faster than most of a model's).
_DOT_SHAPES = ((128, 256, 512), (512, 512, 512), (256, 1024, 256), (1024, 64, 512),
               (64, 512, 512), (512, 128, 1024), (256, 256, 256), (128, 128, 256),
               (64, 256, 128))
#: Contracted sizes of the narrow dots (128 x 512 x K: a small output, whose
#: fresh pages would weigh on a larger one), and the size from which a dot
#: reaches the matrix rate.
_NARROW = (16, 64)
_FULL_CONTRACTION = 256
#: FLOPs from which a plain (Eigen) dot's rate is read.
_PLAIN_FLOPS = 64 * 2 ** 20
#: (type, orientation) of the dots measured: f32 each way, bf16 as is.
_DOT_KINDS = (("float32", "nn"), ("float32", "nt"), ("float32", "tn"), ("bfloat16", "nn"))
#: a @ b with b transposed ("nt") or a ("tn") in memory.
_DOTS = {"nn": lambda a, b: a @ b, "nt": lambda a, b: a @ b.T, "tn": lambda a, b: a.T @ b}
#: The implementation each orientation's dots exercise (XLA:CPU gives the
#: transposed left operand's to Eigen, the others to its library).
_VARIANT_OF = {"nn": "", "nt": "nt", "tn": "plain"}


def measure(runs: int = 3, passes: int = 3) -> DeviceFacts:
  """Measures this machine's CPU as XLA:CPU runs it (see the module's doc).

  Raises:
    TargetError: when the profiler records nothing.
  """
  import tempfile

  import jax
  import jax.numpy as jnp
  import numpy as np

  from hlo_audit._src.errors import HloAuditError
  from hlo_audit._src.target import profile

  cpu = jax.devices("cpu")[0]

  def put(x):
    return jax.device_put(x, cpu)

  # name -> (function, arguments, donate the first argument)
  programs: dict[str, tuple] = {}

  def chain(x, ws):
    for w in ws:
      x = x @ w
    return x

  programs["chain"] = (chain, (put(np.ones((8, 8), np.float32)),
                               [put(np.full((8, 8), 0.125, np.float32))] * _CHAIN), False)
  for n in _BANDWIDTH_SIZES:
    programs[f"stream{n}"] = (lambda x: x * 1.5 + 0.5, (put(np.ones((n,), np.float32)),), True)
  programs["argmax"] = (lambda x: jnp.argmax(x, axis=1),
                        (put(np.ones(_ARGMAX, np.float32)),), False)
  programs["rowsum"] = (lambda x: x.sum(axis=1), (put(np.ones(_ROWSUM, np.float32)),), False)
  for k in _NARROW:
    programs[f"narrow_nn_{k}"] = (_DOTS["nn"], (put(np.ones((128, k), np.float32)),
                                                 put(np.ones((k, 512), np.float32))), False)
  for dtype, orientation in _DOT_KINDS:
    for m, n, k in _DOT_SHAPES:
      a = put(jnp.ones((k, m) if orientation[0] == "t" else (m, k), dtype))
      b = put(jnp.ones((n, k) if orientation[1] == "t" else (k, n), dtype))
      programs[f"dot_{dtype}_{orientation}_{m}_{n}_{k}"] = (_DOTS[orientation], (a, b), False)
  for shape, perm in _TRANSPOSES:
    programs[f"transpose_{'_'.join(map(str, shape))}"] = (
        lambda x, perm=perm: jnp.transpose(x, perm) * 1.5,
        (put(np.ones(shape, np.float32)),), False)

  def fmas(x):
    for _ in range(_FMAS):
      x = x * 0.999 + 0.001
    return x

  def exps(x):
    for _ in range(_EXPS):
      x = jnp.exp(x) * 0.25
    return x

  vec = put(np.full((_VECTOR_ELEMENTS,), 0.5, np.float32))
  programs["fma"] = (fmas, (vec,), False)
  programs["exp"] = (exps, (vec,), False)

  compiled = {}
  with jax.default_device(cpu):
    for name, (fn, args, donate) in programs.items():
      # Each its own module name: the trace tells modules apart by name.
      def named(*a, _fn=fn):
        return _fn(*a)
      named.__name__ = named.__qualname__ = f"hlo_audit_calibrate_{name}"
      jitted = jax.jit(named, donate_argnums=(0,) if donate else ())
      c = jitted.lower(*args).compile()
      text = c.as_text()
      compiled[name] = (c, args, donate, _module_name(text),
                        '"outer_dimension_partitions":["' in text)

  def call(c, args, donate):
    if donate:  # in place, as a program's reused buffers are: no fresh pages
      args = (jnp.array(args[0], copy=True), *args[1:])
      jax.block_until_ready(args)
    return jax.block_until_ready(c(*args))

  for c, args, donate, _, _ in compiled.values():
    for _ in range(2):  # warm: allocations, caches
      call(c, args, donate)
  with tempfile.TemporaryDirectory(prefix="hlo-audit-calibrate-") as d:
    try:
      with jax.profiler.trace(d, create_perfetto_trace=True):
        # In passes over all the programs: a few seconds when the machine
        # runs slow (a neighbour's load) then weigh on every program a little,
        # and the medians stand.
        for _ in range(passes):
          for c, args, donate, _, _ in compiled.values():
            for _ in range(runs):
              call(c, args, donate)
      events = profile.read_trace_events(d)
    except HloAuditError as e:
      raise TargetError(f"calibrating the CPU: {e}") from None
  # One kernel a program: its time runs to the run's end (an Eigen dot's
  # event ends when it hands its work to the thread pool).
  got = {name: profile.kernel_profile(events, module, asynchronous=True)
         for name, (_, _, _, module, _) in compiled.items()}
  for name, p in got.items():
    if not p.runs or not p.kernel_times:
      raise TargetError(f"calibrating the CPU: the profiler recorded no kernel of {name}")

  def seconds(name: str) -> float:
    """The program's main kernel's median time (its longest kernel): the
    statistic the benchmark measures programs' kernels with."""
    return max(got[name].kernel_times.values())

  def split(name: str) -> bool:
    return compiled[name][4]

  launch = got["chain"].step_time / _CHAIN
  overhead, curve = streaming_curve(
      [(8 * n, seconds(f"stream{n}"), split(f"stream{n}")) for n in _BANDWIDTH_SIZES])
  memory = curve[-1][1]
  strided = statistics.median(
      8 * math.prod(shape) / max(seconds(name) - (overhead if split(name) else 0.0), 1e-9)
      for shape, name in ((shape, f"transpose_{'_'.join(map(str, shape))}")
                          for shape, _ in _TRANSPOSES))
  def library(name: str) -> bool:
    text = compiled[name][0].as_text()
    return "__ynn_fusion" in text or "__onednn" in text or "__xnn_fusion" in text

  def reduced_per_second(name: str, shape) -> float:
    return math.prod(shape) / max(seconds(name) - (overhead if split(name) else 0.0), 1e-9)

  loop_reduce = 0.0 if library("argmax") else reduced_per_second("argmax", _ARGMAX)
  library_reduce = reduced_per_second("rowsum", _ROWSUM) if library("rowsum") else 0.0
  def dot_rate(dtype: str, orientation: str) -> float:
    return statistics.median(2 * m * n * k / seconds(f"dot_{dtype}_{orientation}_{m}_{n}_{k}")
                             for m, n, k in _DOT_SHAPES)

  matrix = {"f32": dot_rate("float32", "nn"), "bf16": dot_rate("bfloat16", "nn")}
  # XLA:CPU gives a dot of a transposed left operand to Eigen ("plain"),
  # whose hand-off to its thread pool and back costs a small dot alone far
  # more than its FLOPs (a program's next kernel takes over without that
  # wait): the rate of the larger dots, where the FLOPs dominate.
  large = [s for s in _DOT_SHAPES if 2 * math.prod(s) >= _PLAIN_FLOPS]
  plain = statistics.median(2 * m * n * k / seconds(f"dot_float32_tn_{m}_{n}_{k}")
                            for m, n, k in large)
  variants = {"nt": dot_rate("float32", "nt") / matrix["f32"],
              "plain": plain / matrix["f32"]}
  narrow = {"": tuple(
      (k, min(1.0, 2 * 128 * 512 * k / seconds(f"narrow_nn_{k}") / matrix["f32"]))
      for k in _NARROW) + ((_FULL_CONTRACTION, 1.0),)}
  def work_seconds(name: str) -> float:
    return max(seconds(name) - (overhead if split(name) else 0.0), 1e-9)

  vector = {"f32": 2 * _FMAS * _VECTOR_ELEMENTS / work_seconds("fma")}
  # Each exp's multiply is vector work, priced at the rate just measured.
  exp_s = work_seconds("exp") - _EXPS * _VECTOR_ELEMENTS / vector["f32"]
  transcendental = _EXPS * _VECTOR_ELEMENTS / max(exp_s, 1e-9)
  when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  how = (f"measured on this machine ({when}, jax {jax.__version__}, XLA:CPU kernel "
         "times from jax.profiler)")
  sizes = f"{_BANDWIDTH_SIZES[0] * 4 // 1024} KiB to {_BANDWIDTH_SIZES[-1] * 4 >> 20} MiB"
  sources = {
      "launch_overhead": f"{how}: {_CHAIN} dependent 8x8 dots, the step over {_CHAIN}",
      "memory_bandwidth": f"{how}: x * 1.5 + 0.5 in place on f32 arrays of {sizes}",
      "cache_bandwidths": f"{how}: the same, each size",
      "parallel_overhead": (f"{how}: the smallest of those XLA:CPU splits over threads, "
                            "less its streaming time"),
      "strided_bandwidth": (f"{how}: the median of {len(_TRANSPOSES)} f32 transposes that "
                            "move the minor dimension (384x512 to 8x32x32x32)"),
      "loop_reduction_rate": (f"{how}: argmax over rows of {_ARGMAX[0]}x{_ARGMAX[1]} f32 "
                              "(a loop-emitted reduction)" if loop_reduce else
                              f"{how}: XLA:CPU's argmax ran in a library kernel: none"),
      "matrix_flops": (f"{how}: the median of {len(_DOT_SHAPES)} dots (M x N x K from "
                       f"{'x'.join(map(str, _DOT_SHAPES[0]))} to "
                       f"{'x'.join(map(str, _DOT_SHAPES[1]))}), in f32 and bf16"),
      "matrix_variants": (f"{how}: the same f32 dots with the right operand "
                          "transposed (nt, the library's), and those of 64 MFLOP or more "
                          "with the left one transposed (plain: XLA:CPU's own Eigen "
                          "dots), over the matrix rate"),
      "narrow_contraction": (f"{how}: 128x512xK f32 dots, K = "
                             f"{' and '.join(map(str, _NARROW))}, over the matrix rate"),
      "reduction_rate": (f"{how}: a row sum of {_ROWSUM[0]}x{_ROWSUM[1]} f32 (a library "
                         "kernel)" if library_reduce else
                         f"{how}: XLA:CPU's row sum ran in a loop-emitted kernel: none"),
      "vector_flops": f"{how}: {_FMAS} fused multiply-adds per element in cache",
      "transcendentals_per_second": f"{how}: {_EXPS} fused exps per element in cache",
  }
  return DeviceFacts(
      name="cpu", description=f"{cpu_name()}, {cores()} cores", platform="cpu",
      memory_bandwidth=memory, cache_bandwidths=tuple(curve[:-1]),
      matrix_flops=types.MappingProxyType(matrix),
      matrix_variants=types.MappingProxyType(variants),
      narrow_contraction=types.MappingProxyType(narrow), reduction_rate=library_reduce,
      vector_flops=types.MappingProxyType(vector),
      transcendentals_per_second=transcendental, launch_overhead=launch,
      parallel_overhead=overhead, strided_bandwidth=strided,
      loop_reduction_rate=loop_reduce,
      sources=types.MappingProxyType(sources), measured=True,
      checked=("held against XLA:CPU kernels timed on this machine by "
               "scripts/bench_time_model.py"))


def streaming_curve(points: Sequence[tuple[int, float, bool]]
                    ) -> tuple[float, list[tuple[int, float]]]:
  """(what splitting a kernel over threads adds, in seconds; (bytes, bytes
  per second) of each streaming program), from each program's (bytes,
  seconds, whether XLA:CPU split it over threads), smallest first.

  Kernels XLA:CPU runs on one thread give the rate; the two smallest it
  splits, less their bytes at the largest serial one's rate, what the split
  adds (their median: a thread's wake-up varies from run to run). The curve
  is monotone: a larger working set never streams faster than a smaller one.
  """
  serial = [(b, t) for b, t, parted in points if not parted]
  parted = [(b, t) for b, t, p in points if p]
  overhead = 0.0
  if serial and parted:
    b0, t0 = serial[-1]
    overhead = max(0.0, statistics.median(t - t0 * b / b0 for b, t in parted[:2]))
  curve = [(b, b / max(t - (overhead if p else 0.0), 1e-9)) for b, t, p in points]
  for i in range(len(curve) - 2, -1, -1):
    curve[i] = (curve[i][0], max(curve[i][1], curve[i + 1][1]))
  return overhead, curve


def _module_name(text: str) -> str:
  parts = text.split(None, 2)
  return parts[1].rstrip(",") if len(parts) > 1 else ""
