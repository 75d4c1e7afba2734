"""Sweeps on a Ray cluster: the same rows as the local pool, a dead worker's
point run again, timeouts, resume after a killed driver, GPUs one point at a
time; and without Ray, one line naming the extra.

The cluster is local, started by the tests (two CPUs and one GPU that Ray
is told of but that does not exist: Ray only counts it), on loopback.
Tests that need Ray skip without it, and fail instead where
HLO_AUDIT_RAY=required (CI's run with the `ray` extra).
"""

from __future__ import annotations

import csv
import datetime
import os
import signal
import subprocess
import sys
import time

import pytest

from hlo_audit._src.cli import main as cli_main
from hlo_audit._src.sweep.ray_pool import (Executor, ExecutorError, RayPool,
                                           parse_executor, sent_environment)
from hlo_audit._src.sweep.runner import SweepOptions, plan, point_line, run_sweep
from hlo_audit._src.sweep.store import read_jsonl
from hlo_audit._src.sweep.targets import Measure
from hlo_audit._src.target import calibration

MODEL = """\
import os, signal, time
import jax.numpy as jnp

def f(x, w, mode="ok", marker=""):
  if mode == "die_once" and not os.path.exists(marker):
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
  if mode == "die":
    os.kill(os.getpid(), signal.SIGKILL)
  if mode == "hang":
    time.sleep(300)
  if mode == "raise":
    raise RuntimeError("boom")
  return jnp.tanh(x @ w + 1.0)
"""

ARGS = "x=f32[{b},{d}];w=f32[{d},{2*d}]"

#: Ray's switch for clusters of one machine (on loopback).
LOOPBACK = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

#: Record keys that say when, where and how fast a point ran, not what.
_RUN_KEYS = {"seconds", "pid", "host", "node", "finished_at", "attempts",
             "retried_after", "traceback"}


def _ray_or_skip():
  try:
    import ray
  except ImportError:
    if os.environ.get("HLO_AUDIT_RAY") == "required":
      pytest.fail("HLO_AUDIT_RAY=required but Ray is not installed: "
                  "pip install 'hlo-audit[ray]'")
    pytest.skip("Ray is not installed (pip install 'hlo-audit[ray]')")
  return ray


@pytest.fixture(scope="module")
def cluster():
  """A local Ray cluster for this module's tests; its address."""
  # Ray's single-machine mode: every address on loopback (by default Ray
  # binds to this machine's network address, even for a local cluster). Ray
  # reads it when imported.
  saved = os.environ.get(LOOPBACK)
  os.environ[LOOPBACK] = "0"
  ray = _ray_or_skip()
  ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
           logging_level="ERROR")
  try:
    yield ray.get_runtime_context().gcs_address
  finally:
    ray.shutdown()
    if saved is None:
      os.environ.pop(LOOPBACK, None)
    else:
      os.environ[LOOPBACK] = saved


@pytest.fixture
def model(tmp_path) -> str:
  (tmp_path / "model.py").write_text(MODEL)
  return f"{tmp_path / 'model.py'}:f"


def _options(model, out, grid, **kw) -> SweepOptions:
  return SweepOptions(target=model, out=str(out), grid=grid, args=ARGS, **kw)


def _what(records) -> dict:
  return {r["id"]: {k: v for k, v in r.items() if k not in _RUN_KEYS} for r in records}


def _differences(a: dict, b: dict) -> dict:
  """{point id: {field: (a's, b's)}} where two `_what`s disagree (a failure
  names the fields, not only the points)."""
  return {i: {k: (a.get(i, {}).get(k), b.get(i, {}).get(k))
              for k in a.get(i, {}).keys() | b.get(i, {}).keys()
              if a.get(i, {}).get(k) != b.get(i, {}).get(k)}
          for i in a.keys() | b.keys() if a.get(i) != b.get(i)}


# ------------------------------------------------------- without a cluster --


@pytest.mark.parametrize("text, want", [
    ("local", Executor()), ("ray", Executor("ray")),
    ("ray://head:10001", Executor("ray", "ray://head:10001")),
])
def test_executors_are_local_ray_or_a_ray_client_address(text, want):
  assert parse_executor(text) == want


@pytest.mark.parametrize("text", ["Ray", "ray://", "dask", "ray:head:6379", ""])
def test_other_executors_are_refused_with_what_is_accepted(text):
  with pytest.raises(ExecutorError, match="expected local, ray or ray://HOST:PORT"):
    parse_executor(text)


def test_workers_get_what_decides_the_compile_and_a_gpu_point_keeps_its_gpu():
  environ = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
             "HLO_AUDIT_CACHE_DIR": "/c", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
             "TPU_WORKER_HOSTNAMES": "localhost", "HOME": "/root", "PATH": "/bin",
             "CUDA_VISIBLE_DEVICES": "0"}
  cpu = sent_environment(environ, gpu=False)
  assert cpu == {k: environ[k] for k in ("JAX_PLATFORMS", "XLA_FLAGS", "HLO_AUDIT_CACHE_DIR",
                                         "ALLOW_MULTIPLE_LIBTPU_LOAD",
                                         "TPU_WORKER_HOSTNAMES")}
  # The driver's JAX_PLATFORMS=cpu would keep JAX off the GPU Ray gave it.
  assert sent_environment(environ, gpu=True) == {k: v for k, v in cpu.items()
                                                 if k != "JAX_PLATFORMS"}


def test_without_ray_the_sweep_stops_before_anything_runs_naming_the_extra(
    model, tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
  out = tmp_path / "out"
  with pytest.raises(ExecutorError, match=r"pip install 'hlo-audit\[ray\]'"):
    run_sweep(_options(model, out, "b=8;d=16", executor="ray", jobs=None))
  assert not out.exists()
  code = cli_main.run(["sweep", f"{model}", "--executor=ray", f"--out={out}",
                        f"--args={ARGS}", "--grid=b=8;d=16", "--no-progress"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith("hlo-audit: error: ") and "hlo-audit[ray]" in err[0]
  assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--executor=dask"], "--executor: unknown executor 'dask'"),
    (["--executor=ray", "--jobs=0"], "--jobs must be >= 1 with --executor ray"),
])
def test_bad_executor_flags_are_one_line(model, tmp_path, capsys, flags, message):
  code = cli_main.run(["sweep", model, f"--out={tmp_path / 'out'}", f"--args={ARGS}",
                        "--grid=b=8;d=16", *flags])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and message in err[0], err


class _Unreachable:
  """A Ray whose `init` fails as Ray's own does."""

  def __init__(self, error: Exception):
    self.error = error

  def is_initialized(self):
    return False

  def init(self, **_):
    raise self.error


@pytest.mark.parametrize("address, error, auth, hinted", [
    # A client times out saying nothing of the token it did not send.
    ("ray://head:10001", TimeoutError("Connection timeout while connecting"), None, True),
    ("ray://head:10001", TimeoutError("Connection timeout while connecting"), "token", False),
    # Not a client, or not a timeout: the token is not the likely cause.
    (None, ConnectionError("Connection timeout: no GCS at head:6379"), None, False),
    ("ray://head:10001", ConnectionError("refused"), None, False),
])
def test_an_unreachable_cluster_is_one_line_with_the_token_hint_where_it_fits(
    monkeypatch, address, error, auth, hinted):
  monkeypatch.setitem(sys.modules, "ray", _Unreachable(error))
  monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
  monkeypatch.delenv("RAY_ADDRESS", raising=False)
  if auth:
    monkeypatch.setenv("RAY_AUTH_MODE", auth)
  with pytest.raises(ExecutorError) as e:
    RayPool(Executor("ray", address), measured=False).connect()
  where = address or "this machine"
  assert str(e.value).startswith(f"cannot start or reach a Ray cluster at {where}: "
                                 f"{str(error).splitlines()[0]}")
  assert ("set RAY_AUTH_MODE=token here" in str(e.value)) == hinted


# -------------------------------------------------------- on a local cluster --


def test_a_ray_sweep_records_the_same_rows_as_the_local_pool(cluster, model, tmp_path):
  grid = "b=8,16,24;d=32,64;mode=ok,raise"
  # The CPU's facts cached first: with none cached, the pool's and Ray's
  # workers would each measure them, and two measures differ in their times.
  calibration.cpu_facts()
  local = run_sweep(_options(model, tmp_path / "local", grid, jobs=2))
  on_ray = run_sweep(_options(model, tmp_path / "ray", grid, executor="ray", jobs=None))
  assert (on_ray.total, on_ray.ran, on_ray.failed) == (local.total, local.ran,
                                                       local.failed) == (12, 12, 6)
  a, _ = read_jsonl(str(tmp_path / "local" / "results.jsonl"))
  b, _ = read_jsonl(str(tmp_path / "ray" / "results.jsonl"))
  assert not _differences(_what(a), _what(b))
  # Run in Ray's workers, not here, and said where.
  assert all(r["pid"] != os.getpid() and r["node"] == "127.0.0.1" for r in b)
  ok = next(r for r in b if r["status"] == "ok")
  assert f"s on {ok['host']}):" in point_line(ok)

  def rows(name):
    with open(tmp_path / name / "results.csv", newline="") as f:
      return {r["id"]: {k: v for k, v in r.items() if not k.endswith("_s")}
              for r in csv.DictReader(f)}

  assert rows("ray") == rows("local")


def test_a_point_whose_worker_dies_runs_once_more_and_then_fails_alone(
    cluster, model, tmp_path):
  marker = tmp_path / "died"
  grid = f"b=8;d=16;mode=ok,die_once,die;marker={marker}"
  result = run_sweep(_options(model, tmp_path / "out", grid, executor="ray", jobs=None))
  assert (result.ran, result.failed) == (3, 1)
  records, damaged = read_jsonl(str(tmp_path / "out" / "results.jsonl"))
  assert not damaged
  by_mode = {r["params"]["mode"]: r for r in records}
  assert marker.exists()
  once = by_mode["die_once"]
  assert once["status"] == "ok" and once["attempts"] == 2
  assert once["retried_after"].startswith("WorkerCrashedError")
  assert "s on " in point_line(once) and ", after its first worker died):" in point_line(once)
  dead = by_mode["die"]
  assert dead["status"] == "error" and dead["attempts"] == 2
  assert dead["error"].startswith("WorkerError: the Ray worker died running this "
                                  "point, twice (WorkerCrashedError")
  assert by_mode["ok"]["status"] == "ok" and "attempts" not in by_mode["ok"]


def test_a_point_past_its_timeout_is_cancelled_and_the_others_run(
    cluster, model, tmp_path):
  # The timeout counts from a point's hand-over to Ray, a cold worker's
  # start (a process importing JAX) included (docs/sweeps.md): with five
  # suites on two cores that start alone once took longer than 45 s, and at
  # 20 s beside CI's other two. The "ok" points run
  # first, untimed, so that they find warm workers and the timeout measures
  # the points, not the machine's load.
  run_sweep(_options(model, tmp_path / "warm", "b=8,16;d=16;mode=ok", executor="ray",
                     jobs=None))
  t0 = time.monotonic()
  # Two points hang and two finish, on the cluster's two CPUs.
  result = run_sweep(_options(model, tmp_path / "out", "b=8,16;d=16;mode=ok,hang",
                              executor="ray", jobs=None, point_timeout=20))
  assert time.monotonic() - t0 < 200  # not the 300 s each hanging point sleeps
  records, _ = read_jsonl(str(tmp_path / "out" / "results.jsonl"))
  assert (result.ran, result.failed) == (4, 2)
  for r in records:
    if r["params"]["mode"] == "hang":
      assert r["error"] == ("WorkerError: timed out after 20 s (--point-timeout); its "
                            "Ray task was cancelled")
      assert "attempts" in r and r["attempts"] == 1  # not run again
    else:
      assert r["status"] == "ok"


def test_kernel_points_take_one_gpu_each_and_never_share_it(cluster, tmp_path):
  pytest.importorskip("pallas_kernels")
  # The cluster's one GPU: validated points run one at a time, while
  # audits use both CPUs.
  measured = RayPool(Executor("ray"), measured=True)
  assert "1 GPU(s)" in measured.connect() and measured._read_slots() == 1
  audits = RayPool(Executor("ray"), measured=False)
  audits.connect()
  assert audits._read_slots() == 2
  one = RayPool(Executor("ray"), measured=False, jobs=1)
  one.connect()
  assert one._read_slots() == 1
  out = tmp_path / "mm"
  result = run_sweep(SweepOptions(target="matmul", out=str(out), executor="ray", jobs=None,
                                  grid="m=8,16,24;k=16;n=16",
                                  measure=Measure(validate=True)))
  records, _ = read_jsonl(str(out / "results.jsonl"))
  assert (result.ran, result.failed) == (3, 0) and len(records) == 3
  assert all(r["validation"]["passed"] for r in records)
  spans = sorted((datetime.datetime.fromisoformat(r["finished_at"]).timestamp()
                  - r["seconds"]["total"],
                  datetime.datetime.fromisoformat(r["finished_at"]).timestamp())
                 for r in records)
  for (_, end), (start, _) in zip(spans, spans[1:]):
    assert start >= end - 0.05, spans


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_killed_driver_loses_no_finished_point_and_the_rerun_runs_only_the_rest(
    cluster, model, tmp_path, sig):
  out = tmp_path / "out"
  grid = "b=8,16,24,32,40,48,56,64;d=16,32"
  cmd = [sys.executable, "-m", "hlo_audit", "sweep", model, f"--args={ARGS}",
         f"--grid={grid}", f"--out={out}", "--executor=ray", "--no-progress"]
  env = {**os.environ, "RAY_ADDRESS": cluster}
  with open(tmp_path / "first.log", "w") as log:
    # A shell starts a background job with SIGINT ignored, and a child
    # inherits that; a handler here is reset to the default on exec, so the
    # driver gets Ctrl-C as it would in a terminal however pytest was started.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
      first = subprocess.Popen(cmd + ["--jobs=1"], stdout=log, stderr=log, env=env)
    finally:
      signal.signal(signal.SIGINT, old)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
      if (out / "results.jsonl").exists() and (
          (out / "results.jsonl").read_bytes().count(b"\n") >= 3):
        break
      assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
      time.sleep(0.05)
    first.send_signal(sig)
    code = first.wait(timeout=60)
  if sig == signal.SIGINT:  # said, in one line, and left for a rerun
    log = (tmp_path / "first.log").read_text()
    assert code == 2 and "sweep interrupted; rerun the same command to resume" in log, log
  before, damaged = read_jsonl(str(out / "results.jsonl"))
  assert 3 <= len(before) < 16 and not damaged, "the kill came too late to test a resume"
  lines_before = (out / "results.jsonl").read_bytes().split(b"\n")[:len(before)]

  again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
  assert again.returncode == 0, again.stderr[-2000:]
  assert f"{16 - len(before)} points run (0 failed), {len(before)} already done" in again.stdout
  records, damaged = read_jsonl(str(out / "results.jsonl"))
  ids = [r["id"] for r in records]
  expected = {p.id for p in plan(_options(model, out, grid)).points}
  assert not damaged and len(ids) == 16 and set(ids) == expected
  assert (out / "results.jsonl").read_bytes().split(b"\n")[:len(before)] == lines_before
  assert [r["status"] for r in records] == ["ok"] * 16


def _free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_sweep_through_ray_client_records_like_any_other(cluster, model, tmp_path):
  port = _free_port()
  env = {**os.environ, LOOPBACK: "0",
         # The cluster asks for Ray's token; a client sends it only when told.
         "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}
  server = subprocess.Popen(
      [sys.executable, "-m", "ray.util.client.server", "--host=127.0.0.1",
       # One server for the one client (the proxy's per-client servers are
       # Ray's business, not this test's).
       f"--port={port}", "--mode=legacy", f"--address={cluster}"],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
  try:
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "hlo_audit", "sweep", model, f"--args={ARGS}",
         "--grid=b=8,16;d=16;mode=ok,raise", f"--out={out}",
         f"--executor=ray://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=300, env=env)
  finally:
    server.kill()
    server.wait()
  assert r.returncode == 1, r.stderr[-2000:]  # the two "raise" points failed
  assert "4 points run (2 failed)" in r.stdout
  assert f"to run on Ray cluster ray://127.0.0.1:{port}: 1 node(s), 2 CPU(s)" in r.stderr
  records, _ = read_jsonl(str(out / "results.jsonl"))
  assert sorted((r["params"]["mode"], r["status"]) for r in records) == [
      ("ok", "ok"), ("ok", "ok"), ("raise", "error"), ("raise", "error")]
  assert all(r["node"] == "127.0.0.1" for r in records)


def test_points_whose_workers_die_first_do_not_stop_the_sweep(cluster, model, tmp_path):
  # Three points that crash their workers (twice each) before any runs: the
  # points' own failures, not a cluster that cannot run points.
  result = run_sweep(_options(model, tmp_path / "out", "b=8,16,24,32;d=16;mode=die",
                              executor="ray", jobs=None))
  assert (result.ran, result.failed) == (4, 4)


class _FakeRay:
  """Just enough of Ray for the pool's loop: every task raises `error`."""

  def __init__(self, error):
    import types

    class RayError(Exception):
      pass

    class RayTaskError(RayError):
      cause = None

    self.exceptions = types.SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError)
    self.error = error(self.exceptions)
    self.cancelled = []
    fake = self

    class Remote:
      def options(self, **_):
        return self

      def remote(self, task):
        return object()

    self._remote = Remote()
    self.remote = lambda fn: fake._remote

  def is_initialized(self):
    return True

  def get_runtime_context(self):
    import types

    return types.SimpleNamespace(gcs_address="fake:6379")

  def cluster_resources(self):
    return {"CPU": 2}

  def nodes(self):
    return []

  def wait(self, refs, num_returns, timeout):
    return refs[:1], refs[1:]

  def get(self, ref):
    raise self.error

  def cancel(self, ref, force):
    self.cancelled.append(ref)


def _tasks(n):
  from hlo_audit._src.sweep.points import PlannedPoint, Task
  from hlo_audit._src.sweep.targets import TargetRef

  ref = TargetRef("m.py:f", ARGS)
  return [Task(target=ref, point=PlannedPoint(id=f"p{i}", index=i, values={}, params={}),
               measure=Measure()) for i in range(n)]


def test_a_cluster_whose_tasks_cannot_start_stops_the_sweep_after_three(monkeypatch):
  def cannot_import(ex):
    e = ex.RayTaskError("ray::_run_point()")
    e.cause = ModuleNotFoundError("No module named 'hlo_audit'")
    return e

  fake = _FakeRay(cannot_import)
  monkeypatch.setitem(sys.modules, "ray", fake)
  pool = RayPool(Executor("ray"), measured=False)
  pool.connect()
  records = []
  with pytest.raises(ExecutorError, match="3 points failed in Ray before any ran"):
    pool.run(_tasks(10), records.append)
  assert [r["error"] for r in records] == [
      "RayTaskError: ModuleNotFoundError: No module named 'hlo_audit'"] * 3
  assert len(fake.cancelled) == 1  # the other point in flight when it stopped


def test_a_cluster_that_lists_no_gpu_has_none():
  # Ray lists only the resources a cluster has: no "GPU" key, no GPU, and
  # measured points run interpreted on its CPUs.
  fake = _FakeRay(lambda ex: None)
  with pytest.MonkeyPatch.context() as m:
    m.setitem(sys.modules, "ray", fake)
    pool = RayPool(Executor("ray"), measured=True)
    line = pool.connect()
  assert "2 CPU(s), 0 GPU(s)" in line and "it has no GPU" in line, line
  assert not pool._gpu
  # An audit-only sweep measures no kernel: a GPU's absence is no news.
  with pytest.MonkeyPatch.context() as m:
    m.setitem(sys.modules, "ray", fake)
    line = RayPool(Executor("ray"), measured=False).connect()
  assert line.endswith("2 CPU(s), 0 GPU(s)"), line


def test_the_raylets_own_messages_are_kept_off_the_progress_bar_and_no_others(
    monkeypatch):
  import types  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.sweep import ray_pool  # pylint: disable=import-outside-toplevel
  printed = []
  worker = types.SimpleNamespace(print_to_stdstream=lambda data, *a, **k: printed.append(data))
  monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(__path__=[]))
  monkeypatch.setitem(sys.modules, "ray._private", types.SimpleNamespace(worker=worker))
  original = worker.print_to_stdstream
  quiet = ray_pool._QuietRayletErrors()
  raylet = {"pid": "raylet", "ip": "127.0.0.1", "lines": ["A worker died"]}
  assert worker.print_to_stdstream(raylet) is None
  worker_line = {"pid": 4242, "ip": "127.0.0.1", "lines": ["hello"]}
  worker.print_to_stdstream(worker_line)
  worker.print_to_stdstream("plain text")
  assert printed == [worker_line, "plain text"]
  quiet.restore()
  assert worker.print_to_stdstream is original


@pytest.mark.parametrize("message, said", [
    # A server's traceback: its first line ends with a colon, its last says
    # what went wrong; the frames between say nothing.
    ("Failed to start the GCS server:\n  File \"gcs.py\", line 12, in start\n"
     "    serve()\nOSError: [Errno 98] Address already in use\n",
     "Failed to start the GCS server: OSError: [Errno 98] Address already in use"),
    # A message that says what on its first line keeps that line alone.
    ("Ray is already running here.\nSee the logs in /tmp/ray/session_latest.",
     "Ray is already running here."),
])
def test_a_failed_start_is_reported_by_the_lines_that_say_what(message, said):
  fake = _FakeRay(lambda ex: None)
  fake.is_initialized = lambda: False

  def init(**_):
    raise RuntimeError(message)

  fake.init = init
  with pytest.MonkeyPatch.context() as m:
    m.setitem(sys.modules, "ray", fake)
    m.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ExecutorError) as e:
      RayPool(Executor("ray"), measured=False).connect()
  assert str(e.value) == f"cannot start or reach a Ray cluster at this machine: {said}", \
      str(e.value)


@pytest.mark.parametrize("jobs", [0, -1])
def test_a_ray_pool_takes_one_job_or_more_or_none(jobs):
  assert RayPool(Executor("ray"), measured=False, jobs=1).jobs == 1
  assert RayPool(Executor("ray"), measured=False, jobs=4).jobs == 4
  with pytest.raises(ValueError, match=f"a Ray pool needs jobs >= 1 or None, got {jobs}"):
    RayPool(Executor("ray"), measured=False, jobs=jobs)

