"""Running a sweep: plan the points, run them serially or in worker processes,
record each as it finishes, then plot and write the sweep report.

Before planning, the options and the GPU target are checked and the grid's
points counted (the product of its lists' lengths, without making them): a
sweep with more than `max_points` to run stops there. Planning resolves every
grid point up front (a bad name or value stops the sweep before anything
compiles), gives each a stable id from what it computes, merges points with
the same id (they would compile the same program), keeps this shard's share
(round-robin), and skips points the out folder already holds.

`executor="ray"` runs each point as a Ray task instead (`ray_pool`); the
sweep process still writes every record.

`jobs=0` runs points in this process (no start-up cost, no isolation).
`jobs=N` runs them in N worker processes (spawned: JAX does not survive a
fork), each importing JAX once and then taking one point at a time; a worker
that dies (a crash in XLA, the OOM killer) or runs past `point_timeout` fails
only its point, and a fresh worker takes its place.
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import connection
from typing import Any

from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.report.safe import printable
from hlo_audit._src.sweep import grid as grid_lib
from hlo_audit._src.sweep import ray_pool
from hlo_audit._src.sweep import store as store_lib
from hlo_audit._src.sweep.grid import GridError
from hlo_audit._src.sweep.points import PlannedPoint, Task, execute, record_of
from hlo_audit._src.sweep.targets import (KernelTarget, Measure, Target, TargetRef,
                                          make_target)

#: Points to run above which `hlo-audit sweep` asks for --yes: at about a
#: second a point on one worker, 10,000 are a few hours, and a grid larger
#: than that is more often a list typed one item too long than a plan.
MAX_POINTS = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class SweepOptions:
  """Everything a sweep needs; `hlo-audit sweep` builds it from its flags."""

  #: "example", MODULE:FUNCTION, or a kernel name ("matmul", ...).
  target: str
  #: Output folder (results, plots, report).
  out: str
  #: `--grid` text, `name=v1,v2;name2=v3`.
  grid: str | None = None
  #: A JSON or TOML grid file.
  grid_file: str | None = None
  #: The argument template of a MODULE:FUNCTION target.
  args: str | None = None
  measure: Measure = Measure()
  #: Local: 0 runs points in this process, N >= 1 in N worker processes.
  #: Ray: at most N points in flight; None: as many as the cluster has
  #: slots for.
  jobs: int | None = 1
  #: Where points run: "local" (this machine), "ray" (the Ray cluster that
  #: `ray.init()` finds: RAY_ADDRESS, one started on this machine, else a new
  #: one) or "ray://HOST:PORT" (Ray Client).
  executor: str = "local"
  num_shards: int = 1
  shard_index: int = 0
  #: Run points again that a previous run recorded as failed.
  retry_failed: bool = False
  #: Seconds before a worker's point is abandoned (not with jobs=0).
  point_timeout: float | None = None
  #: Write each point's HTML audit to <out>/points/<id>.html.
  point_reports: bool = False
  #: Plot and write the report after running.
  report: bool = True
  #: Only plot and write the report from the records already there.
  report_only: bool = False
  #: Grid name for the plots' x axis (default: the numeric one with most values).
  plot_x: str | None = None
  #: The command line, for the report.
  command: str = ""
  #: Refuse (GridError, before planning) a sweep with more points than this
  #: to run in its shard; None: no limit.
  max_points: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
  """The grid expanded, merged, sharded."""

  target: TargetRef
  #: Every distinct point of the grid (all shards).
  points: tuple[PlannedPoint, ...]
  #: This shard's points.
  shard_points: tuple[PlannedPoint, ...]
  #: Grid points merged into an earlier identical one.
  duplicates: int
  #: The grid's names, in order.
  names: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class SweepResult:
  """What a sweep run did."""

  out: str
  #: Points in this shard.
  total: int
  #: Skipped: already in the out folder.
  skipped: int
  #: Run in this invocation.
  ran: int
  #: Of those, failed.
  failed: int
  duplicates: int
  seconds: float
  #: Files written: results, plots, reports.
  files: tuple[str, ...] = ()


def build_grid(options: SweepOptions) -> grid_lib.Grid:
  """The grid of `--grid-file` with `--grid`'s lists replacing its own."""
  g = grid_lib.Grid()
  if options.grid_file:
    g = grid_lib.load_grid_file(options.grid_file)
  if options.grid:
    g = g.replace_axes(grid_lib.parse_grid(options.grid))
  return g


def plan(options: SweepOptions, target: Target | None = None,
         grid: grid_lib.Grid | None = None) -> Plan:
  """Expands, checks, merges and shards the grid (`grid`: the options', built
  here unless given; compiles nothing).

  Raises:
    GridError: for a bad grid, target, template or shard, or measurements a
      target cannot make.
  """
  ref = TargetRef(options.target, options.args)
  target = target or make_target(ref)
  m = options.measure
  if (m.validate or m.time) and not isinstance(target, KernelTarget):
    raise GridError("--validate and --time apply to kernel targets (a kernel "
                    "library's ops, e.g. matmul)")
  if m.time and (m.repeats < 1 or m.warmup < 0):
    raise GridError(f"need --repeats >= 1 and --warmup >= 0, got {m.repeats}, {m.warmup}")
  g = grid if grid is not None else build_grid(options)
  points: list[PlannedPoint] = []
  seen: set[str] = set()
  duplicates = 0
  for i, values in enumerate(g.points()):
    params = target.resolve(values)
    pid = grid_lib.point_id({**target.identity(params), "measure": m.identity})
    if pid in seen:
      duplicates += 1
      continue
    seen.add(pid)
    points.append(PlannedPoint(id=pid, index=i, values=values, params=params))
  if options.plot_x and points and options.plot_x not in points[0].params:
    raise GridError(f"--plot-x {options.plot_x!r} is not a parameter of the points; "
                    f"known: {', '.join(points[0].params)}")
  mine = grid_lib.shard(points, options.num_shards, options.shard_index)
  return Plan(target=ref, points=tuple(points), shard_points=tuple(mine),
              duplicates=duplicates, names=g.names)


# ----------------------------------------------------------- running ----


def _die_with_parent() -> None:
  """Asks Linux to kill this worker when the sweep process dies (a killed
  sweep must not leave workers compiling)."""
  if sys.platform != "linux":
    return
  try:
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def _worker_main(conn) -> None:
  """A worker process: say it is ready, then run one task at a time until
  told to stop."""
  _die_with_parent()
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # The parent handles Ctrl-C.
  # Import the heavy parts before taking work, so that a point's timeout
  # counts the point, not JAX's start-up.
  import jax  # noqa: F401
  from hlo_audit._src import audit  # noqa: F401

  conn.send(_READY)
  targets: dict[TargetRef, Target] = {}
  while True:
    try:
      task = conn.recv()
    except (EOFError, OSError):
      return
    if task is None:
      return
    conn.send(execute(task, targets))


#: A worker's first message: imports done, ready for tasks.
_READY = "ready"

#: Workers that may die before they are ready before the pool gives up.
_START_FAILURES = 3


class WorkerStartError(HloAuditError, RuntimeError):
  """Worker processes die before they can take a point."""


@dataclasses.dataclass
class _Worker:
  process: Any
  conn: Any
  ready: bool = False
  task: Task | None = None
  started: float = 0.0


class WorkerPool:
  """`jobs` spawned worker processes, each running one task at a time."""

  def __init__(self, jobs: int, point_timeout: float | None = None):
    if jobs < 1:
      raise ValueError(f"a pool needs jobs >= 1, got {jobs}")
    self.jobs = jobs
    self.point_timeout = point_timeout
    self._ctx = multiprocessing.get_context("spawn")
    self._workers: list[_Worker] = []
    self._start_failures = 0

  def _start(self) -> None:
    parent, child = self._ctx.Pipe()
    p = self._ctx.Process(target=_worker_main, args=(child,), daemon=True,
                          name="hlo-audit-sweep-worker")
    p.start()
    child.close()
    self._workers.append(_Worker(process=p, conn=parent))

  def _retire(self, w: _Worker, kill: bool) -> None:
    if kill and w.process.is_alive():
      w.process.kill()
    w.process.join(timeout=5)
    w.conn.close()
    self._workers.remove(w)

  def run(self, tasks: Sequence[Task], on_record: Callable[[dict], None]) -> None:
    """Runs `tasks`, calling `on_record` (in this process) as each finishes.

    Raises:
      WorkerStartError: if workers keep dying before they are ready.
    """
    pending = deque(tasks)
    try:
      while True:
        busy = sum(w.task is not None for w in self._workers)
        if not pending and not busy:
          return
        while len(self._workers) < min(self.jobs, len(pending) + busy):
          self._start()
        for w in list(self._workers):
          if w.ready and w.task is None and pending:
            w.task, w.started = pending.popleft(), time.monotonic()
            try:
              w.conn.send(w.task)
            except (BrokenPipeError, OSError):
              self._lost(w, on_record, self._death(w))
        watched = [w for w in self._workers if not w.ready or w.task is not None]
        ready = set(connection.wait([w.conn for w in watched] +
                                    [w.process.sentinel for w in watched],
                                    timeout=self._wait_time()))
        for w in watched:
          if w.conn in ready or w.conn.poll():
            try:
              msg = w.conn.recv()
            except (EOFError, OSError):
              self._died(w, on_record)
              continue
            if msg == _READY:
              w.ready = True
            else:
              w.task = None
              on_record(msg)
          elif w.process.sentinel in ready:
            self._died(w, on_record)
          elif (w.task is not None and self.point_timeout is not None and
                time.monotonic() - w.started > self.point_timeout):
            self._lost(w, on_record, f"timed out after {self.point_timeout:g} s "
                       "(--point-timeout); the worker was killed", kill=True)
    finally:
      self.close()

  def _wait_time(self) -> float | None:
    running = [w for w in self._workers if w.task is not None]
    if self.point_timeout is None or not running:
      return None
    left = min(self.point_timeout - (time.monotonic() - w.started) for w in running)
    return max(0.05, left)

  def _died(self, w: _Worker, on_record) -> None:
    if w.task is not None:
      self._lost(w, on_record, self._death(w))
      return
    why = self._death(w)
    self._retire(w, kill=True)
    self._start_failures += 1
    if self._start_failures >= _START_FAILURES:
      raise WorkerStartError(f"{self._start_failures} worker processes died before "
                             f"taking a point ({why.split('(')[-1].rstrip(')')}); "
                             "try --jobs=0 to see the error")

  def _death(self, w: _Worker) -> str:
    w.process.join(timeout=5)
    code = w.process.exitcode
    if code is not None and code < 0:
      try:
        how = f"killed by {signal.Signals(-code).name}"
      except ValueError:
        how = f"killed by signal {-code}"
    else:
      how = f"exit code {code}"
    return f"the worker process died running this point ({how})"

  def _lost(self, w: _Worker, on_record, why: str, kill: bool = False) -> None:
    """Records `w`'s point as failed and retires `w`; the loop starts a fresh
    worker when one is needed."""
    task = w.task
    self._retire(w, kill=kill)
    on_record({**record_of(task, f"WorkerError: {why}"), "traceback": None,
               "seconds": {"total": time.monotonic() - w.started}, "pid": w.process.pid})

  def close(self) -> None:
    """Stops every worker (politely, then by force)."""
    for w in list(self._workers):
      try:
        if w.task is None and w.ready:
          w.conn.send(None)
      except (BrokenPipeError, OSError):
        pass
    deadline = time.monotonic() + 5
    for w in list(self._workers):
      if w.task is None and w.ready:
        w.process.join(timeout=max(0.0, deadline - time.monotonic()))
      self._retire(w, kill=True)


# ---------------------------------------------------------- progress ----


class Reporter:
  """Receives progress events; the base class is silent."""

  def start(self, total: int, skipped: int, description: str,
            label_names: Sequence[str] = ()) -> None:
    """Called once, before the first point runs; `label_names` are the grid
    names that vary (to label points by)."""

  def point(self, record: Mapping, done: int, total: int) -> None:
    """Called as each point finishes."""

  def message(self, text: str) -> None:
    """A line for the user."""

  def stop(self) -> None:
    """Called once at the end (also after an interruption)."""


def point_line(record: Mapping, label_names: Sequence[str] | None = None) -> str:
  """One line about a finished point: its values (those of `label_names`, or
  all), outcome and key numbers; printable (the values and the error are the
  user's text)."""
  return printable(_point_line(record, label_names))


def _point_line(record: Mapping, label_names: Sequence[str] | None) -> str:
  from hlo_audit._src.report.units import fmt_bytes, fmt_time

  params = record["params"]
  names = [k for k in params if k != "args"] if label_names is None else label_names
  label = " ".join(f"{k}={params.get(k)}" for k in names) or record["id"]
  secs = record.get("seconds", {}).get("total", 0.0)
  # Where a Ray task ran it, and whether its first worker died under it.
  where = f" on {record['host']}" if record.get("node") else ""
  if record.get("retried_after") and record.get("status") == "ok":
    where += ", after its first worker died"
  if record.get("status") != "ok":
    return f"FAIL {label} ({secs:.1f} s{where}): {record.get('error')}"
  a = record["audit"]
  parts = [f"ok   {label} ({secs:.1f} s{where}):", f"{a['kernels']} kernels,",
           f"peak {fmt_bytes(a['peak_bytes'])} (XLA {fmt_bytes(a['xla_peak_bytes'])}),",
           f"saves {fmt_bytes(a['bytes_saved'])}"]
  if a.get("step_time") is not None:
    parts.append(f", est. step {fmt_time(a['step_time'])} on {a.get('time_device')}")
  v, t = record.get("validation"), record.get("timing")
  if v:
    parts.append(", valid" if v["passed"] else ", INVALID")
  if t:
    parts.append(f", {t['speedup']:.2f}x vs XLA" + (" (interpret)" if t["interpret"] else ""))
  return " ".join(parts).replace(" ,", ",")


class RichReporter(Reporter):
  """A rich progress bar (points done, rate, time left) and a line per point.

  Every text it shows is printed as it is: a subject, path or value is the
  user's, so neither Rich markup (`[bold]`) nor emoji codes (`:ok:`) in it
  are interpreted, and control characters are shown escaped (`printable`).
  """

  def __init__(self, console=None, lines: bool = True):
    from rich.console import Console

    self.console = console or Console(stderr=True, markup=False, emoji=False,
                                      highlight=False)
    self.lines = lines
    self._progress = None

  def start(self, total, skipped, description, label_names=()):
    self._names = list(label_names) or None
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn,
                               TextColumn, TimeElapsedColumn, TimeRemainingColumn)
    from rich.text import Text

    class Rate(ProgressColumn):
      def render(self, task):
        speed = task.finished_speed or task.speed
        return Text("-- pts/min" if speed is None else f"{60 * speed:.1f} pts/min")

    self._progress = Progress(
        TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
        MofNCompleteColumn(), Rate(), TimeElapsedColumn(), TextColumn("left"),
        TimeRemainingColumn(),
        console=self.console, transient=False)
    self._progress.start()
    self._task = self._progress.add_task(printable(description), total=total,
                                         completed=skipped)

  def point(self, record, done, total):
    if self.lines:
      self._progress.console.print(f"[{done}/{total}] " + point_line(record, self._names),
                                   markup=False, emoji=False, highlight=False,
                                   soft_wrap=True)
    self._progress.advance(self._task)

  def message(self, text):
    (self._progress.console if self._progress else self.console).print(
        printable(text), markup=False, emoji=False, highlight=False, soft_wrap=True)

  def stop(self):
    if self._progress is not None:
      self._progress.stop()
      self._progress = None


# -------------------------------------------------------------- sweep ----


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def check_device(options: SweepOptions) -> None:
  """Resolves the GPU the points compile for, once, before any point runs:
  an unknown name, a bad spec file or GPU count, or missing CUDA wheels would
  otherwise fail every point alike. Resolving needs no GPU plugin; the
  wheels are asked for only when points are to compile (not --report-only).

  Raises:
    TargetError: for an unknown target, a bad spec file or `gpus`, or
      missing wheels (one line, with the pip command).
    GridError: for validation or timing with a GPU target.
  """
  if options.measure.device is None:
    return
  target = options.measure.compile_target()
  if not options.report_only:
    from hlo_audit._src.target import wheels

    wheels.require_for(target)


def shard_size(total: int, num_shards: int, shard_index: int) -> int:
  """How many of `total` points round-robin sharding gives shard
  `shard_index` (as `grid.shard`, without the list)."""
  return max(0, (total - shard_index + num_shards - 1) // num_shards)


def check_size(options: SweepOptions, g: grid_lib.Grid) -> None:
  """Stops a sweep with more than `options.max_points` points to run in
  this shard, counted from the grid's lists before any point is made (so a
  grid of millions is refused at once, not after minutes of planning).
  Duplicates and points already done count too: finding them is planning.

  Raises:
    GridError: "N points to run (...); pass --yes to run them, or narrow the
      grid".
  """
  if options.report_only or options.max_points is None:
    return
  n = shard_size(g.size, options.num_shards, options.shard_index)
  if n <= options.max_points:
    return
  lists = " x ".join(f"{a.name} {len(a.values)}" for a in g.axes)
  if g.extra:
    lists += f"{' + ' if lists else ''}{len(g.extra)} extra point(s)"
  where = (f"shard {options.shard_index} of {options.num_shards} of a "
           f"{g.size:,}-point grid" if options.num_shards > 1 else "grid")
  raise GridError(f"{n:,} points to run ({where}: {lists}; over --max-points "
                  f"{options.max_points:,}); pass --yes to run them, or narrow the grid")


def run_sweep(options: SweepOptions, reporter: Reporter | None = None) -> SweepResult:
  """Runs (or resumes) a sweep, then plots and writes the report.

  Raises:
    GridError: for bad options, grid, target or template, or more points
      than `max_points` (before anything runs).
    TargetError: for a GPU target that cannot be compiled for (`check_device`).
    StoreError: if the out folder cannot be written or is in use, or holds a
      results file with a line that is not a record.
    ExecutorError: for an unknown executor, Ray not installed (before
      anything runs), a Ray cluster that cannot be reached, or one whose
      workers fail every point before running one.
  """
  reporter = reporter or Reporter()
  t0 = time.perf_counter()
  executor = ray_pool.parse_executor(options.executor)
  if executor.kind == "ray":
    if options.jobs is not None and options.jobs < 1:
      raise GridError(f"--jobs must be >= 1 with a Ray executor, got {options.jobs}")
    if not options.report_only:
      ray_pool.import_ray()  # Before anything runs: one line naming the extra.
  elif options.jobs is None or options.jobs < 0:
    raise GridError(f"--jobs must be >= 0, got {options.jobs}")
  grid_lib.shard((), options.num_shards, options.shard_index)  # (checks the pair)
  target = make_target(TargetRef(options.target, options.args))
  check_device(options)
  g = build_grid(options)
  check_size(options, g)
  if g.size > MAX_POINTS:
    reporter.message(f"planning {g.size:,} grid points")
  p = plan(options, target, g)
  shard = [options.shard_index, options.num_shards]
  ran = failed = skipped = 0
  if not options.report_only:
    names = list(p.names) + [k for k in (p.points[0].params if p.points else {})
                             if k not in p.names]
    with store_lib.ResultStore(options.out, names, num_shards=options.num_shards,
                               shard_index=options.shard_index,
                               retry_failed=options.retry_failed) as store:
      todo = [pt for pt in p.shard_points if pt.id not in store.state.done]
      skipped = len(p.shard_points) - len(todo)
      html_dir = os.path.join(options.out, "points") if options.point_reports else None
      if html_dir:
        os.makedirs(html_dir, exist_ok=True)
      tasks = [Task(target=p.target, point=pt, measure=options.measure,
                    html_path=os.path.join(html_dir, pt.id + ".html") if html_dir else None)
               for pt in todo]
      host = socket.gethostname()

      def on_record(record: dict) -> None:
        nonlocal ran, failed
        # A Ray worker's record names its own host.
        record.update(finished_at=_now(), host=record.get("host", host), shard=shard)
        store.append(record)
        ran += 1
        failed += record.get("status") != "ok"
        reporter.point(record, skipped + ran, len(p.shard_points))

      if store.state.repaired:
        reporter.message(f"repaired {store.jsonl_path}: {store.state.repaired}")
      pool: WorkerPool | ray_pool.RayPool | None = None
      if tasks and executor.kind == "ray":
        m = options.measure
        pool = ray_pool.RayPool(executor, measured=m.validate or m.time,
                                jobs=options.jobs, point_timeout=options.point_timeout,
                                message=reporter.message)
        where = f" on {pool.connect()}"
      elif tasks and options.jobs:
        pool = WorkerPool(min(options.jobs, len(tasks)), options.point_timeout)
        where = f" on {pool.jobs} worker process(es)"
      else:
        where = " in this process" if tasks else ""
      reporter.message(
          f"sweep {options.target}: {len(p.points)} points"
          + (f" ({p.duplicates} duplicate grid points merged)" if p.duplicates else "")
          + (f", shard {options.shard_index} of {options.num_shards}: "
             f"{len(p.shard_points)}" if options.num_shards > 1 else "")
          + f"; {skipped} already done, {len(tasks)} to run" + where)
      label_names = [n for n in p.names
                     if len({repr(pt.values.get(n)) for pt in p.points}) > 1]
      reporter.start(len(p.shard_points), skipped, options.target, label_names)
      try:
        if pool is not None:
          pool.run(tasks, on_record)
        elif tasks:
          targets = {p.target: target}
          for task in tasks:
            on_record(execute(task, targets))
      finally:
        reporter.stop()
  files = []
  if options.report or options.report_only:
    from hlo_audit._src.sweep import report as report_lib

    files = report_lib.write_sweep_outputs(options, p)
  return SweepResult(out=options.out, total=len(p.shard_points), skipped=skipped,
                     ran=ran, failed=failed, duplicates=p.duplicates,
                     seconds=time.perf_counter() - t0, files=tuple(files))
