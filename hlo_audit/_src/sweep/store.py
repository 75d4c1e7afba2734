"""Sweep results on disk: JSONL (the record of truth) and CSV, appended as each
point finishes, so a killed sweep resumes with nothing lost or doubled.

Files in the out folder, per shard: `results.jsonl` and `results.csv` for an
unsharded sweep, `results-<i>-of-<n>.jsonl` / `.csv` for shard i of n. Each
record is one JSON line, written, flushed and fsynced before the next point
is reported done. A kill can leave at most one torn last line (a record cut
short, without its newline): opening the store drops it, and rewrites the CSV
from the JSONL (the CSV may have lagged a row or been torn too). A bad line
anywhere else, or a line that is JSON but not a record, was not left by a
kill: the file was edited or damaged, and reading it stops with the file and
line (`StoreError`) rather than drop or rewrite what someone wrote there. A
lock file keeps two sweeps from writing one shard's files at once. Readers
(`load_records`) merge every shard's file, one record per point id: a
finished point over a failed one, then the later one.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import glob
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hlo_audit._src.analysis.records import FindingKind
from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.report.safe import printable

#: Version of the record layout (`schema` in every record).
RECORD_SCHEMA = 1

#: CSV columns after the id, status and parameter columns: (column, path into
#: the record).
METRIC_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kernels", ("audit", "kernels")),
    ("materialized_bytes", ("audit", "materialized_bytes")),
    ("peak_bytes", ("audit", "peak_bytes")),
    ("xla_peak_bytes", ("audit", "xla_peak_bytes")),
    ("peak_agreement", ("audit", "peak_agreement")),
    ("bytes_saved", ("audit", "bytes_saved")),
    ("findings", ("audit", "findings")),
    ("actionable", ("audit", "actionable")),
    *((f"findings_{k.slug.replace('-', '_')}", ("audit", "findings_by_class", k.slug))
      for k in FindingKind),
    ("flops", ("audit", "flops")),
    # The estimated step on `time_device` and its split (blank where the
    # device was unknown, and in records written before the estimate).
    ("step_time_s", ("audit", "step_time")),
    ("memory_time_s", ("audit", "memory_time")),
    ("compute_time_s", ("audit", "compute_time")),
    ("launch_time_s", ("audit", "launch_time")),
    ("communication_time_s", ("audit", "communication_time")),
    ("time_device", ("audit", "time_device")),
    ("hlo_fingerprint", ("hlo_fingerprint",)),
    ("kernel_bytes_moved", ("kernel", "bytes_moved")),
    ("validation_passed", ("validation", "passed")),
    ("kernel_err", ("validation", "kernel_err")),
    ("xla_err", ("validation", "xla_err")),
    ("err_bound", ("validation", "bound")),
    ("grad_err", ("validation", "grad_err")),
    ("kernel_ms", ("timing", "kernel_ms")),
    ("xla_ms", ("timing", "xla_ms")),
    ("speedup", ("timing", "speedup")),
    ("interpret", ("timing", "interpret")),
    ("compile_s", ("seconds", "compile")),
    ("analysis_s", ("seconds", "analysis")),
    ("validate_s", ("seconds", "validate")),
    ("time_s", ("seconds", "time")),
    ("total_s", ("seconds", "total")),
    ("error", ("error",)),
)


class StoreError(HloAuditError, OSError):
  """An out folder that cannot be written, or one another sweep holds."""


def shard_stem(num_shards: int, shard_index: int) -> str:
  """'results' unsharded, else 'results-002-of-008'."""
  if num_shards == 1:
    return "results"
  return f"results-{shard_index:03d}-of-{num_shards:03d}"


def read_jsonl(path: str) -> tuple[list[dict], bool]:
  """Records of one JSONL file, and whether its last line needs repair (torn,
  and dropped; or whole but without its newline). A missing file has no
  records.

  Raises:
    StoreError: for a line that is not a record (see the module docstring).
  """
  records, repair = _read_jsonl(path)
  return records, bool(repair)


def _read_jsonl(path: str) -> tuple[list[dict], str]:
  """`read_jsonl`, with the repair the last line needs in words ('' for
  none)."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    return [], ""
  except OSError as e:
    raise StoreError(f"cannot read {path!r}: {e.strerror}") from None
  lines = data.split(b"\n")
  tail = lines.pop()  # b"" when the file ends with a newline, as written.
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
      raise _bad_line(path, number, "not JSON") from None
    why = record_problem(rec)
    if why:
      raise _bad_line(path, number, why)
    records.append(rec)
  if not tail.strip():
    return records, ""
  try:
    rec = json.loads(tail)
  except (json.JSONDecodeError, UnicodeDecodeError):
    # A record cut short is never whole JSON: this is what a kill leaves.
    return records, "dropped a torn last line"
  why = record_problem(rec)
  if why:
    raise _bad_line(path, len(lines) + 1, why)
  records.append(rec)
  return records, "ended its last line, which had no newline"


def record_problem(rec: Any) -> str | None:
  """Why a line's JSON is not a sweep record (what readers rely on: an id,
  a status, the parameters), or None."""
  if not isinstance(rec, dict):
    kind = ("array" if isinstance(rec, list) else "string" if isinstance(rec, str)
            else "null" if rec is None else "boolean" if isinstance(rec, bool)
            else "number")
    return f"not a sweep record (a JSON {kind}, not an object)"
  missing = [k for k, kind in (("id", str), ("status", str), ("params", dict))
             if not isinstance(rec.get(k), kind)]
  if "id" not in missing and not rec["id"]:
    missing.insert(0, "id")
  if missing:
    return f"not a sweep record (no valid {', '.join(missing)})"
  return None


def _bad_line(path: str, number: int, why: str) -> StoreError:
  return StoreError(f"{printable(path)}:{number}: {why}; only the last line can be "
                    "torn by a kill, so this file was edited or damaged: mend or "
                    "delete that line, or use another --out")


def _better(new: Mapping, old: Mapping) -> bool:
  """Whether record `new` should stand for its point instead of `old`."""
  new_ok, old_ok = new.get("status") == "ok", old.get("status") == "ok"
  if new_ok != old_ok:
    return new_ok
  return str(new.get("finished_at", "")) >= str(old.get("finished_at", ""))


def merge(records: Iterable[Mapping]) -> list[dict]:
  """One record per id (see `_better`), in order of first appearance."""
  best: dict[str, dict] = {}
  for r in records:
    if r["id"] not in best or _better(r, best[r["id"]]):
      best[r["id"]] = dict(r)
  return list(best.values())


def load_records(out_dir: str) -> list[dict]:
  """Every shard's records in `out_dir`, merged (one per point id)."""
  files = sorted(glob.glob(os.path.join(out_dir, "results*.jsonl")))
  # The unsharded file first, then shards in order.
  files.sort(key=lambda p: os.path.basename(p) != "results.jsonl")
  out: list[dict] = []
  for path in files:
    out += read_jsonl(path)[0]
  return merge(out)


def _get(record: Mapping, path: Sequence[str]):
  v: Any = record
  for key in path:
    if not isinstance(v, Mapping):
      return None
    v = v.get(key)
  return v


def csv_row(record: Mapping, param_names: Sequence[str]) -> list[str]:
  """One CSV row: id, status, parameters, then `METRIC_COLUMNS`."""
  params = record["params"]
  cells: list[Any] = [record["id"], record.get("status", "")]
  cells += [params.get(n) for n in param_names]
  for name, path in METRIC_COLUMNS:
    v = _get(record, path)
    if v is None and path[:2] == ("audit", "findings_by_class") and record.get("audit"):
      v = 0  # An audited point with no finding of this class.
    cells.append(v)
  return ["" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v))
          for v in cells]


def csv_header(param_names: Sequence[str]) -> list[str]:
  return ["id", "status", *param_names, *(c for c, _ in METRIC_COLUMNS)]


def _atomic_write(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8", newline="") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


@dataclasses.dataclass(frozen=True, slots=True)
class OpenState:
  """What `ResultStore.open` found."""

  #: Records of every shard's files (merged), before this run.
  records: tuple[dict, ...]
  #: Ids of points finished ok, or failed and not to be retried.
  done: frozenset[str]
  #: What was mended in this shard's JSONL ('dropped a torn last line'), or
  #: '' for nothing.
  repaired: str
  #: Failed records dropped from this shard's JSONL to be run again.
  retried: int


class ResultStore:
  """Appends records to one shard's JSONL and CSV (see the module docstring).

  Use as a context manager: `open()` on entry, `close()` on exit.
  """

  def __init__(self, out_dir: str, param_names: Sequence[str], *,
               num_shards: int = 1, shard_index: int = 0, retry_failed: bool = False):
    self.out_dir = out_dir
    self.param_names = list(param_names)
    self.stem = shard_stem(num_shards, shard_index)
    self.jsonl_path = os.path.join(out_dir, self.stem + ".jsonl")
    self.csv_path = os.path.join(out_dir, self.stem + ".csv")
    self.retry_failed = retry_failed
    self._lock = self._jsonl = self._csv = self._writer = None

  def __enter__(self) -> ResultStore:
    self.state = self.open()
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def open(self) -> OpenState:
    """Locks the shard, repairs its files, and opens them for appending.

    Raises:
      StoreError: if the folder cannot be written, another sweep holds the
        shard, or a results file has a line that is not a record.
    """
    try:
      os.makedirs(self.out_dir, exist_ok=True)
      self._lock = open(os.path.join(self.out_dir, f".{self.stem}.lock"), "w")
    except OSError as e:
      raise StoreError(f"cannot write to {self.out_dir!r}: {e.strerror}") from None
    try:
      fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      self._lock.close()
      self._lock = None
      raise StoreError(f"another sweep is writing {self.jsonl_path!r}; wait for it "
                       "or use another --out") from None
    try:
      own, repair = _read_jsonl(self.jsonl_path)
      everything = merge(load_records(self.out_dir))
    except StoreError:
      self.close()
      raise
    kept = merge(own)
    retried = 0
    if self.retry_failed:
      retried = sum(r.get("status") != "ok" for r in kept)
      kept = [r for r in kept if r.get("status") == "ok"]
    if repair or len(kept) != len(own):
      _atomic_write(self.jsonl_path, "".join(json.dumps(r) + "\n" for r in kept))
    if self.retry_failed:
      everything = [r for r in everything if r.get("status") == "ok"]
    # Parameter columns: this run's, then any older records' in order.
    for r in kept:
      for name in r["params"]:
        if name not in self.param_names:
          self.param_names.append(name)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(csv_header(self.param_names))
    for r in kept:
      writer.writerow(csv_row(r, self.param_names))
    _atomic_write(self.csv_path, buf.getvalue())
    self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
    self._csv = open(self.csv_path, "a", encoding="utf-8", newline="")
    self._writer = csv.writer(self._csv, lineterminator="\n")
    return OpenState(records=tuple(everything),
                     done=frozenset(r["id"] for r in everything),
                     repaired=repair, retried=retried)

  def append(self, record: Mapping) -> None:
    """Writes one finished point to the JSONL (synced) and the CSV."""
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    os.fsync(self._jsonl.fileno())
    self._writer.writerow(csv_row(record, self.param_names))
    self._csv.flush()

  def close(self) -> None:
    for f in (self._jsonl, self._csv, self._lock):
      if f is not None:
        f.close()
    self._jsonl = self._csv = self._lock = self._writer = None
