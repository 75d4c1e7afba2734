"""Running a sweep's points as Ray tasks, on a Ray cluster that is already
there (`ray start` on a SLURM allocation, KubeRay) or one started here.

Each point is one task that returns its record; the sweep process appends
it, as it does for its own worker processes, so it stays the only writer of
the results and everything the local pool promises holds: resume, a killed
sweep losing no finished point and tearing no line. What differs:

- Resources: an audit asks for one CPU; a point that validates or times a
  kernel asks for one GPU (and a CPU), so that Ray runs one such point per
  GPU at a time and a timing never shares its GPU. A cluster with no GPU
  runs them on CPUs (interpret mode), as the local pool would, and says so.
- Points in flight are bounded by the cluster's slots for them (re-read as
  nodes come and go) or `jobs`, whichever is lower, so that a point's
  `point_timeout` counts its run, not a wait in Ray's queue.
- A worker or node that dies fails only its point, which is run once more;
  a second death records the point with the error Ray gave. A timed-out
  point's task is cancelled (its worker killed) and recorded, not retried.
- Workers do not inherit this process's environment: the variables that
  decide what a point compiles (`JAX_*`, `XLA_*`, `HLO_AUDIT_*`, libtpu's)
  are sent with each task, except `JAX_PLATFORMS` to a point given a GPU.
- Every record gains `host` and `node` (the worker's host name and its Ray
  node's address); progress lines show the host.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.sweep import points

#: What `--executor ray` needs installed.
RAY_EXTRA = "pip install 'hlo-audit[ray]'"

#: Environment variables sent to every point's worker: they decide what a
#: point compiles for and where the audit caches what it measured.
_SENT_PREFIXES = ("JAX_", "XLA_", "HLO_AUDIT_", "TPU_", "LIBTPU_")
_SENT_NAMES = ("ALLOW_MULTIPLE_LIBTPU_LOAD",)

#: Infrastructure failures in a row, with no point done, after which the
#: sweep stops: every point would fail the same way (hlo-audit not installed
#: on the workers, a runtime environment that cannot be set up).
_START_FAILURES = 3

#: Seconds between reads of the cluster's size.
_RESOURCE_POLL_S = 5.0


class ExecutorError(HloAuditError, RuntimeError):
  """An executor that cannot be used: an unknown name, Ray not installed, a
  cluster that cannot be reached or whose workers cannot run a point."""


@dataclasses.dataclass(frozen=True, slots=True)
class Executor:
  """Where a sweep's points run."""

  #: "local" (worker processes here) or "ray".
  kind: str = "local"
  #: Ray's address: None finds one as `ray.init()` does (RAY_ADDRESS, then
  #: a cluster started on this machine, else starts one); "ray://HOST:PORT"
  #: connects through Ray Client.
  address: str | None = None


def parse_executor(text: str) -> Executor:
  """`local`, `ray` or `ray://HOST:PORT`.

  Raises:
    ExecutorError: for anything else.
  """
  t = text.strip()
  if t == "local":
    return Executor()
  if t == "ray":
    return Executor("ray")
  if t.startswith("ray://") and len(t) > len("ray://"):
    return Executor("ray", t)
  raise ExecutorError(f"unknown executor {text!r}: expected local, ray or "
                      "ray://HOST:PORT")


def import_ray():
  """Ray, or one line that names the extra.

  Raises:
    ExecutorError: if Ray is not installed.
  """
  try:
    import ray
  except ImportError as e:
    raise ExecutorError(f"--executor ray needs Ray ({e}): {RAY_EXTRA}") from None
  return ray


# ------------------------------------------------------------- worker ----

#: A worker's targets, made once per worker process and reused by its
#: later points (as in a local worker).
_TARGETS: dict = {}


def _run_point(task: points.Task) -> dict[str, Any]:
  """The body of a point's Ray task: the point, and where it ran."""
  import ray

  record = points.execute(task, _TARGETS)
  record["host"] = socket.gethostname()
  # The driver turns it into the node's address as the cluster knows it
  # (a worker sees only its own interfaces).
  record["node"] = ray.get_runtime_context().get_node_id()
  return record


def sent_environment(environ: Mapping[str, str], gpu: bool) -> dict[str, str]:
  """The variables a point's worker is given (`gpu`: the point has a GPU,
  where this process's `JAX_PLATFORMS`, often `cpu` on a driver with no GPU,
  would keep JAX off it)."""
  env = {k: v for k, v in environ.items()
         if k.startswith(_SENT_PREFIXES) or k in _SENT_NAMES}
  if gpu:
    env.pop("JAX_PLATFORMS", None)
  return env


# ------------------------------------------------------------- driver ----


@dataclasses.dataclass
class _Flight:
  task: Any
  started: float
  attempt: int
  #: The first attempt's error, for a point run again.
  retried_after: str | None = None


class RayPool:
  """Runs tasks as Ray tasks; the interface of the local `WorkerPool`."""

  def __init__(self, executor: Executor, *, measured: bool, jobs: int | None = None,
               point_timeout: float | None = None,
               message: Callable[[str], None] | None = None):
    """`measured`: points validate or time a kernel (one GPU each where the
    cluster has GPUs); `jobs`: at most this many points in flight (None: the
    cluster's slots); `message`: a line for the user."""
    if executor.kind != "ray":
      raise ValueError(f"not a Ray executor: {executor}")
    if jobs is not None and jobs < 1:
      raise ValueError(f"a Ray pool needs jobs >= 1 or None, got {jobs}")
    self.executor = executor
    self.measured = measured
    self.jobs = jobs
    self.point_timeout = point_timeout
    self._message = message or (lambda _: None)
    self._ray = None
    self._started_ray = False
    self._gpu = False
    self._slots = 1
    self._slots_read = -float("inf")
    self._nodes: dict[str, str] = {}

  # -- connection --

  def connect(self) -> str:
    """Connects to (or starts) the cluster; returns a line describing it.

    Raises:
      ExecutorError: Ray is not installed, or the cluster cannot be reached.
    """
    ray = self._ray = import_ray()
    if not ray.is_initialized():
      try:
        # The workers' own output (JAX's warnings) stays in Ray's logs: a
        # failed point's error is in its record.
        ray.init(address=self.executor.address, log_to_driver=False,
                 logging_level=logging.WARNING)
      except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        where = self.executor.address or os.environ.get("RAY_ADDRESS") or "this machine"
        lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
        first = lines[0] if lines else type(e).__name__
        if first.endswith(":") and len(lines) > 1:
          first += " " + lines[-1]  # a server's traceback: its last line says what
        hint = ""
        if where.startswith("ray://") and "timeout" in first and \
            os.environ.get("RAY_AUTH_MODE") != "token":
          # Ray's clusters ask for a token by default; its client sends none
          # unless told, and then times out saying nothing of it.
          hint = ("; if the cluster uses Ray's token authentication (the default), "
                  "set RAY_AUTH_MODE=token here")
        raise ExecutorError(f"cannot start or reach a Ray cluster at {where}: "
                            f"{first[:300]}{hint}") from None
      self._started_ray = True
    res = ray.cluster_resources()
    cpus, gpus = int(res.get("CPU", 0)), int(res.get("GPU", 0))
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    self._gpu = self.measured and gpus > 0
    self._read_slots()  # (the first read: _slots_read starts at -inf)
    line = (f"Ray cluster {self.executor.address or ray.get_runtime_context().gcs_address}: "
            f"{nodes} node(s), {cpus} CPU(s), {gpus} GPU(s)")
    if self.measured and not gpus:
      line += ("; it has no GPU: kernels are validated and timed on CPUs "
               "(interpret mode)")
    return line

  def _read_slots(self) -> int:
    now = time.monotonic()
    if now - self._slots_read >= _RESOURCE_POLL_S:
      res = self._ray.cluster_resources()
      have = int(res.get("GPU" if self._gpu else "CPU", 0))
      self._slots = max(1, have if self.jobs is None else min(self.jobs, have or 1))
      self._slots_read = now
    return self._slots

  def _remote(self):
    ray = self._ray
    opts: dict[str, Any] = {"num_cpus": 1, "max_retries": 0}
    if self._gpu:
      opts["num_gpus"] = 1
    env = sent_environment(os.environ, gpu=self._gpu)
    if env:
      opts["runtime_env"] = {"env_vars": env}
    return ray.remote(_run_point).options(**opts)

  # -- running --

  def run(self, tasks: Sequence, on_record: Callable[[dict], None]) -> None:
    """Runs `tasks`, calling `on_record` (in this process) as each finishes.

    Raises:
      ExecutorError: the cluster cannot be reached, or its workers fail
        every point before running one.
    """
    if self._ray is None:
      self.connect()
    ray = self._ray
    remote = self._remote()
    pending = deque(tasks)
    flights: dict[Any, _Flight] = {}
    start_failures = 0
    anything_ran = False

    def submit(task, attempt: int = 1, retried_after: str | None = None) -> None:
      ref = remote.remote(task)
      flights[ref] = _Flight(task, time.monotonic(), attempt, retried_after)

    quiet = _QuietRayletErrors()
    interrupted = False
    try:
      while pending or flights:
        while pending and len(flights) < self._read_slots():
          submit(pending.popleft())
        # Short waits: Ctrl-C is seen between them, and timeouts on time.
        ready, _ = ray.wait(list(flights), num_returns=1, timeout=self._wait_time(flights))
        for ref in ready:
          flight = flights.pop(ref)
          record, why, unstarted = self._result(ref, flight)
          if record is None:  # Its worker died: once more.
            submit(flight.task, flight.attempt + 1, why)
            continue
          if unstarted and not anything_ran:
            start_failures += 1
            if start_failures >= _START_FAILURES:
              on_record(record)
              raise ExecutorError(f"{start_failures} points failed in Ray before any "
                                  f"ran ({record['error']}); is hlo-audit installed "
                                  "on the cluster's workers?")
          anything_ran |= not unstarted
          on_record(record)
        self._expire(flights, on_record)
    except KeyboardInterrupt:
      interrupted = True
      raise
    finally:
      quiet.restore()
      # Ctrl-C ends the driver, and with it the job's tasks on the cluster.
      # Cancelling them first races their replies: Ray aborts the driver on
      # a reply to a task it cancelled ("Tried to complete task that was not
      # pending"), before the sweep can say how to resume.
      for ref in () if interrupted else flights:
        ray.cancel(ref, force=True)
      if self._started_ray:
        ray.shutdown()
        self._started_ray = False
        self._ray = None

  def _wait_time(self, flights: Mapping[Any, _Flight]) -> float:
    if self.point_timeout is None or not flights:
      return 1.0
    now = time.monotonic()
    left = min(self.point_timeout - (now - f.started) for f in flights.values())
    return min(1.0, max(0.05, left))

  def _result(self, ref, flight: _Flight) -> tuple[dict | None, str | None, bool]:
    """The point's record, Ray's error line for a failure outside the
    point's own code, and whether the task never ran the point (Ray could
    not start it); (None, error, False) for a point to run again."""
    ex = self._ray.exceptions
    try:
      record = self._ray.get(ref)
    except ex.RayTaskError as e:
      # Raised outside `execute` (which records every error of the point):
      # the task could not start (hlo-audit or the subject's module missing
      # on the worker).
      cause = getattr(e, "cause", None) or e
      why = points.error_line(cause)
      return self._failed(flight, f"RayTaskError: {why}"), why, True
    except _retryable(ex) as e:
      # The point ran and its worker died (XLA crashed, the OOM killer).
      why = _first_sentence(e)
      if flight.attempt == 1:
        return None, why, False
      return self._failed(flight, f"WorkerError: the Ray worker died running this "
                          f"point, twice ({why})"), why, False
    except ex.RayError as e:  # A runtime environment Ray could not set up, ...
      why = _first_line(e)
      return self._failed(flight, f"WorkerError: {why}"), why, True
    record["node"] = self._node_address(record.get("node"))
    if flight.retried_after:
      record["attempts"] = flight.attempt
      record["retried_after"] = flight.retried_after
    return record, None, False

  def _node_address(self, node_id: str | None) -> str | None:
    """A node's address (`NodeManagerAddress`), read from the cluster again
    when a node joined since; the id where Ray no longer lists it."""
    if node_id is None:
      return None
    if node_id not in self._nodes:
      self._nodes = {n["NodeID"]: n.get("NodeManagerAddress") for n in self._ray.nodes()}
    return self._nodes.get(node_id) or node_id

  def _failed(self, flight: _Flight, error: str) -> dict:
    record = {**points.record_of(flight.task, error), "traceback": None,
              "seconds": {"total": time.monotonic() - flight.started},
              "attempts": flight.attempt}
    if flight.retried_after:
      record["retried_after"] = flight.retried_after
    return record

  def _expire(self, flights: dict, on_record) -> None:
    if self.point_timeout is None:
      return
    now = time.monotonic()
    for ref, flight in list(flights.items()):
      if now - flight.started > self.point_timeout:
        del flights[ref]
        self._ray.cancel(ref, force=True)
        on_record(self._failed(flight, f"WorkerError: timed out after "
                                       f"{self.point_timeout:g} s (--point-timeout); "
                                       "its Ray task was cancelled"))


class _QuietRayletErrors:
  """Keeps Ray's driver from printing its raylet's error messages (a worker
  died, ...) while points run: each such point's record and progress line
  already say it, and Ray's multi-line, coloured text would tear the
  progress bar. Ray has no switch for it (`log_to_driver` covers workers'
  output only), so its printer is wrapped where Ray's driver looks it up;
  a Ray without that name is left as it is."""

  def __init__(self):
    try:
      from ray._private import worker
    except ImportError:
      worker = None
    self._module = worker
    self._original = getattr(worker, "print_to_stdstream", None)
    if self._original is None:
      return
    original = self._original

    def printer(data, *args, **kwargs):
      if isinstance(data, dict) and data.get("pid") == "raylet":
        return None
      return original(data, *args, **kwargs)

    worker.print_to_stdstream = printer

  def restore(self) -> None:
    if self._original is not None:
      self._module.print_to_stdstream = self._original
      self._original = None


def _retryable(ex) -> tuple[type, ...]:
  """Ray's errors for a point whose worker or node died under it."""
  names = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError",
           "ObjectLostError", "LocalRayletDiedError")
  return tuple(getattr(ex, n) for n in names if hasattr(ex, n))


def _first_sentence(e: BaseException) -> str:
  """`Type: first sentence` (Ray's messages go on with advice on its logs)."""
  text = str(e).strip()
  first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else ""
  return f"{type(e).__name__}: {first}"[:300]


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  first = text.splitlines()[0] if text else ""
  return f"{type(e).__name__}: {first}"[:500]
