"""Snapshots of the audit: each committed compile's whole JSON report, as it
was when a person last read it.

The truth suite judges the findings a user acts on; a snapshot holds
everything else the report says as well (every record's bytes, text, risks
and kernel; every buffer's live range; the peak, the groups, the timeline),
so that no change to an analysis goes unseen. A snapshot is not truth: when
a change is meant, rewrite the snapshots, read the difference this module
prints, and commit it with the change that made it.

The compiles, all committed (none is made at test time, so a snapshot does
not move with the installed jax):
  * `h200/`: the suite's models and the built-in example compiled for an
    H200 (`h200_support.py`);
  * `cpu/`: the same compiled for XLA:CPU, with XLA's buffer-assignment and
    live-range reports (`write_cpu_fixture`; jax `CPU_JAX`);
  * the GPU dump folders of `tests/hlo_audit/capture/gpu_dumps/`.

  python -m tests.hlo_audit.real_models.snapshots update [KEY...]
      rewrites the snapshots (all, or those named: `cpu/lstm`, `h200/moe`,
      `dump/jax-0.11.2/rnn_step`) and prints what changed;
  python -m tests.hlo_audit.real_models.snapshots cpu NAME...
      recompiles CPU fixtures (a model's name, `example` or
      `swapped_example`) with this jax.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gzip
import json
import pathlib
import re
import shutil
import sys
import tempfile

import hlo_audit
from hlo_audit._src.target import devices, specs

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SNAPSHOTS = HERE / "snapshots"
H200 = HERE / "h200"
CPU = HERE / "cpu"
DUMPS = HERE.parent / "capture" / "gpu_dumps"
#: The jax whose XLA:CPU compiled `cpu/` (its HLO differs from release to
#: release; the audit of a given HLO does not).
CPU_JAX = "0.10.2"

#: A CPU fixture's files: HLO text, and XLA's reports beside it.
#: part -> (suffix of XLA's dump file, of the fixture's).
_CPU_PARTS = {"hlo": ("", ".hlo.gz"),
              "buffer_assignment": ("-buffer-assignment", ".buffer-assignment.txt.gz"),
              "live_range": ("-live-range", ".live-range.txt.gz")}


def keys() -> tuple[str, ...]:
  """Every committed compile, as `<kind>/<name>`."""
  out = [f"h200/{p.name[:-len('.hlo.gz')]}" for p in sorted(H200.glob("*.hlo.gz"))]
  out += [f"cpu/{p.name[:-len('.hlo.gz')]}" for p in sorted(CPU.glob("*.hlo.gz"))]
  out += [f"dump/{p.parent.parent.name}/{p.parent.name}"
          for p in sorted(DUMPS.glob("*/*/*after_optimizations.txt"))]
  return tuple(out)


def _gunzip(path: pathlib.Path) -> str:
  return gzip.decompress(path.read_bytes()).decode()


#: The CPU the `cpu/` snapshots are priced on: fixed facts, of the order of
#: a two-core server VM's, so that a snapshot's times do not move with the
#: machine that runs the tests (this machine's own are measured).
REFERENCE_CPU = hlo_audit.DeviceFacts(
    name="reference-cpu", description="a fixed two-core CPU for the snapshots",
    platform="cpu", memory_bandwidth=40e9, cache_bandwidths=((2 ** 20, 60e9),),
    matrix_flops={"f32": 150e9, "bf16": 150e9}, matrix_variants={"nt": 0.8, "plain": 1.5},
    narrow_contraction={"": ((16, 0.3), (64, 0.7), (256, 1.0))},
    vector_flops={"f32": 60e9}, transcendentals_per_second=1e9, launch_overhead=1e-6,
    parallel_overhead=25e-6, strided_bandwidth=10e9, loop_reduction_rate=0.35e9)
#: The H200 compiles (committed, and the dumps') are priced on the H200, as
#: hlo-audit's copy of XLA's spec gives it (the installed CUDA plugin's
#: would name itself as the source).
_H200 = hlo_audit.AuditOptions(device=devices.gpu_facts(
    next(s for s in specs.bundled_specs() if s.name == "h200")))
#: Significant digits a snapshot keeps of a float: sums of the same floats
#: differ in the last digits between Pythons (3.12's sum() compensates).
_DIGITS = 10


def audit(key: str) -> hlo_audit.AuditReport:
  kind, _, name = key.partition("/")
  if kind == "h200":
    return hlo_audit.audit_hlo(_gunzip(H200 / f"{name}.hlo.gz"), options=_H200)
  if kind == "cpu":
    from hlo_audit._src.capture.capture import capture_text
    texts = {part: _gunzip(CPU / f"{name}{ours}") for part, (_, ours) in _CPU_PARTS.items()}
    return hlo_audit.audit_capture(capture_text(
        texts["hlo"], source=f"cpu/{name}.hlo", buffer_assignment=texts["buffer_assignment"],
        live_range=texts["live_range"]), hlo_audit.AuditOptions(device=REFERENCE_CPU))
  if kind == "dump":
    return hlo_audit.audit_hlo(DUMPS / name, options=_H200)
  raise KeyError(key)


def report_dict(key: str) -> dict:
  """The audit's JSON report, as JSON reads it back (lists, not tuples),
  the dump's path taken from the checkout's root (which varies); with the
  split-K gemms and what-ifs the report alone does not hold (`_what_ifs`)."""
  report = audit(key)
  d = json.loads(report.to_json(indent=None))
  path = d["module"].get("path")
  if path and pathlib.Path(path).is_absolute():
    d["module"]["path"] = str(pathlib.Path(path).relative_to(ROOT))
  d["split_k"] = [dataclasses.asdict(s) for s in report.split_k]
  d["what_ifs"] = _what_ifs(report)
  for f in d["findings"]:
    # Which Pallas backend builds a kernel for the GPU is the installed
    # jax's choice (Mosaic GPU on Hopper from 0.11), not the compile's.
    f["guard_verdict"] = _GPU_BACKEND.sub(r"\1)", f["guard_verdict"])
  return _rounded(json.loads(json.dumps(d)))


_GPU_BACKEND = re.compile(r"(guard passes on gpu): (?:triton|mosaic_gpu)\)")


def _rounded(x):
  """`x` with every float to `_DIGITS` significant digits."""
  if isinstance(x, float):
    return float(f"{x:.{_DIGITS}g}")
  if isinstance(x, list):
    return [_rounded(v) for v in x]
  if isinstance(x, dict):
    return {k: _rounded(v) for k, v in x.items()}
  return x


def _what_ifs(report: hlo_audit.AuditReport) -> dict:
  """The replays a user asks for first: every boundary found fused away,
  every argument found undonated donated, the split-K sums written once,
  the three largest intermediates recomputed; a replay refused gives its
  error's text."""
  buffers = {b.name for b in report.buffers}
  asks = {
      "fuse": dict(fuse=[f for f in report.actionable
                         if f.kind.fix == "fuse" and f.boundary in buffers]),
      "donate": dict(donate=[f.boundary for f in report.findings_of("argument not donated")]),
      "unsplit": dict(unsplit=[s.partials for s in report.split_k]),
      "remat": dict(remat=[b.name for b in report.intermediates[:3]]),
  }
  out = {}
  for name, ask in asks.items():
    try:
      out[name] = report.with_what_if(report.what_if(**ask)).to_dict()["what_if"]
    except hlo_audit.WhatIfError as e:
      out[name] = f"WhatIfError: {e}"
  return out


def snapshot_path(key: str) -> pathlib.Path:
  return SNAPSHOTS / f"{key.replace('/', '__')}.json.gz"


@functools.cache
def snapshot(key: str) -> dict | None:
  path = snapshot_path(key)
  return json.loads(_gunzip(path)) if path.exists() else None


def differences(old, new, path: str = "", limit: int = 25) -> list[str]:
  """Where `new` differs from `old`, as `path: old -> new` lines (at most
  `limit`; a list that grew or shrank says so once)."""
  out: list[str] = []

  def walk(a, b, at: str) -> None:
    if len(out) >= limit:
      return
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(a.keys() | b.keys()):
        field = f"{at}.{k}" if at else k
        if k not in b:
          out.append(f"{field}: removed")
        elif k not in a:
          out.append(f"{field}: added {_short(b[k])}")
        else:
          walk(a[k], b[k], field)
    elif isinstance(a, list) and isinstance(b, list):
      if len(a) != len(b):
        out.append(f"{at}: {len(a)} -> {len(b)} entries")
        if not any(isinstance(v, (dict, list)) for v in a + b):
          # Names or numbers gained or lost: which, not where each shifted.
          gone, new = collections.Counter(map(json.dumps, a)), collections.Counter(
              map(json.dumps, b))
          out[-1] += "".join(f" {sign}[{', '.join(sorted(c.elements()))}]"
                             for sign, c in (("-", gone - new), ("+", new - gone)) if c)
          return
      for i, (x, y) in enumerate(zip(a, b)):
        walk(x, y, f"{at}[{i}]")
    elif a != b or type(a) is not type(b):
      out.append(f"{at}: {_short(a)} -> {_short(b)}")

  walk(old, new, path)
  return out[:limit]


def _short(v, width: int = 160) -> str:
  s = json.dumps(v)
  return s if len(s) <= width else s[:width - 3] + "..."


def write_snapshot(key: str) -> list[str]:
  """Rewrites `key`'s snapshot; returns what changed."""
  new = report_dict(key)
  old = snapshot(key)
  SNAPSHOTS.mkdir(exist_ok=True)
  text = json.dumps(new, indent=1, sort_keys=True) + "\n"
  snapshot_path(key).write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
  snapshot.cache_clear()
  return ["new snapshot"] if old is None else differences(old, new, limit=10**6)


def write_cpu_fixture(name: str) -> pathlib.Path:
  """Compiles model `name` (or the built-in example) for XLA:CPU and writes
  its optimized HLO and XLA's reports under `cpu/`."""
  import jax

  from tests.hlo_audit.real_models import h200_support
  fn, args = h200_support.program(name)
  cpu = jax.devices("cpu")[0]
  lowered = h200_support.lower_step(fn, args, jax.sharding.SingleDeviceSharding(cpu))
  folder = tempfile.mkdtemp(prefix="hlo_audit_cpu_fixture_")
  try:
    lowered.compile(compiler_options={"xla_dump_to": folder, "xla_dump_hlo_as_text": True})
    # The step's module is the largest one XLA optimized.
    hlo = max(pathlib.Path(folder).glob("*after_optimizations.txt"),
              key=lambda p: p.stat().st_size)
    CPU.mkdir(exist_ok=True)
    for xla, ours in _CPU_PARTS.values():
      text = hlo.with_name(hlo.name[:-len(".txt")] + xla + ".txt").read_text()
      (CPU / f"{name}{ours}").write_bytes(
          gzip.compress(text.encode(), compresslevel=9, mtime=0))
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  return CPU / f"{name}.hlo.gz"


def main(argv: list[str]) -> int:
  if len(argv) < 1 or argv[0] not in ("update", "cpu"):
    print(__doc__)
    return 2
  if argv[0] == "cpu":
    import jax
    if jax.__version__ != CPU_JAX:
      print(f"note: CPU_JAX says {CPU_JAX}, this is jax {jax.__version__}: update it")
    for name in argv[1:]:
      print(write_cpu_fixture(name))
    return 0
  for key in argv[1:] or keys():
    changed = write_snapshot(key)
    print(f"{key}: {len(changed)} change(s)" + "".join(f"\n  {c}" for c in changed[:40]) +
          (f"\n  ... {len(changed) - 40} more" if len(changed) > 40 else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
