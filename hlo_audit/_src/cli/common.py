"""What every CLI verb shares: exit codes, output options, report emission."""

from __future__ import annotations

import argparse
import enum
import os
import shlex
import sys

from hlo_audit._src.errors import HloParseError
from hlo_audit._src.report import layout
from hlo_audit._src.report.grouping import SORTS
from hlo_audit._src.report.report import AuditReport, finding_kind
from hlo_audit._src.report.units import fmt_bytes, fmt_time, parse_bytes, parse_time
from hlo_audit._src.target import wheels

#: Text report width when stdout is not a terminal (and COLUMNS is unset).
PIPED_WIDTH = layout.PIPED_WIDTH


class ExitCode(enum.IntEnum):
  """Exit codes scripts can rely on."""

  #: Audited; no finding of a `--fail-on` class.
  OK = 0
  #: A finding of a `--fail-on` class was found (CI mode).
  FINDINGS = 1
  #: Bad usage or input: unknown flag, unreadable file, malformed HLO.
  USAGE = 2


class UsageError(Exception):
  """A problem with the command line or its inputs (exit code 2)."""


def add_verbose_flag(p: argparse.ArgumentParser) -> None:
  p.add_argument("-v", "--verbose", action="store_true",
                 help="on bad input, also show the offending lines")


def add_output_flags(p: argparse.ArgumentParser) -> None:
  out = p.add_argument_group("output")
  fmt = out.add_mutually_exclusive_group()
  fmt.add_argument("--json", action="store_true", help="print the report as JSON")
  fmt.add_argument("--markdown", action="store_true", help="print the report as Markdown")
  out.add_argument("--all", action="store_true",
                   help="every table: kernels, intermediate tensors, every finding group "
                        "with its members and decision record")
  out.add_argument("--top", type=int, default=None, metavar="N",
                   help="finding groups in the default view (default: 15)")
  out.add_argument("--sort", choices=SORTS, default="time",
                   help="rank finding groups by estimated time saved (default), by "
                        "memory traffic saved, or by peak memory saved")
  out.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
  out.add_argument("--trace", metavar="PATH",
                   help="also write the estimated timeline as Chrome trace JSON (opens in "
                        "https://ui.perfetto.dev or chrome://tracing)")
  out.add_argument("--fail-on", metavar="CLASS", action="append", default=[],
                   help="exit 1 if a finding of this class appears (repeatable or "
                        "comma-separated; e.g. unfused-epilogue,standalone-copy)")
  out.add_argument("--min-bytes", metavar="SIZE", type=_size, default=0,
                   help="with --fail-on: only finding groups (the same pattern at one "
                        "source line) saving at least SIZE per run fail, e.g. 1MiB")
  out.add_argument("--min-time", metavar="TIME", type=_time, default=None,
                   help="with --fail-on: only finding groups whose estimated saving is at "
                        "least TIME per step fail, e.g. 5us, 1.5ms (needs a time estimate: "
                        "a known device)")
  out.add_argument("--what-if", metavar="CHANGES", default=None,
                   help="replay the peak with changes made, e.g. 'donate=0,1', "
                        "'donate=params;remat=fusion.3', 'drop=NAME', 'fuse=2' (finding "
                        "numbers), 'unsplit=NAME' (a GPU gemm's split-K partial sums); "
                        "prints the replayed peak beside the original")
  out.add_argument("--width", type=int, default=None,
                   help="width of the text report (default: $COLUMNS, else the terminal's; "
                   f"{PIPED_WIDTH} when piped)")
  add_verbose_flag(p)


def _size(text: str) -> int:
  try:
    return parse_bytes(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def _time(text: str) -> float:
  try:
    return parse_time(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def add_device_flag(p: argparse.ArgumentParser, *, target_alias: bool = False) -> None:
  """--device (and, where nothing is compiled, --target for the same)."""
  names = ("--device", "--target") if target_alias else ("--device",)
  p.add_argument(*names, dest="device", metavar="NAME", default=None,
                 help="price the kernels' time on this device: a GPU (h200, h100, b200, "
                      "...), a TPU (v5e, v6e, v5p, v4: hlo-audit targets) or cpu (this "
                      "machine, calibrated once); default: the device the HLO was "
                      "compiled for, where known")


def fail_on_classes(values: list[str]):
  kinds = []
  for v in values:
    for part in v.split(","):
      part = part.strip()
      if part:
        try:
          kinds.append(finding_kind(part))
        except ValueError as e:
          raise UsageError(str(e)) from None
  return kinds


def check_output_flags(args: argparse.Namespace) -> None:
  """The output flags' values checked before any work (a bad one must not
  cost a compile first).

  Raises:
    UsageError: naming the flag.
  """
  if not hasattr(args, "fail_on"):
    return
  kinds = fail_on_classes(args.fail_on)
  if args.min_time is not None and not kinds:
    raise UsageError("--min-time applies to --fail-on: name the classes that fail")
  if args.top is not None and args.top < 0:
    raise UsageError(f"--top {args.top}: expected a number of finding groups >= 0")
  if args.width is not None and args.width < 1:
    raise UsageError(f"--width {args.width}: expected a positive number of columns")


def hints(prefix: list[str], swap: str | None = None) -> tuple[tuple[str, str], ...]:
  """The footer's next commands for a verb invoked as `prefix` (`swap`: the
  kernel library `--swap` swaps in, if the verb has the flag)."""
  cmd = shlex.join(prefix)
  out = [(f"{cmd} --all", "every kernel, buffer and decision record"),
         (f"{cmd} --html audit.html", "grouped findings and the memory view, in a browser"),
         (f"{cmd} --json", "the whole report, machine-readable"),
         (f"{cmd} --fail-on unfused-epilogue --min-bytes 1MiB", "exit 1 on such gaps, for CI")]
  if swap:
    out.append((f"{cmd} --swap", f"swap {swap} in, and check the gaps close"))
  return tuple(out)


def add_devices_flag(p: argparse.ArgumentParser) -> None:
  p.add_argument("--devices", type=int, default=None, metavar="N",
                 help="compile for N devices (on CPU: N host devices, "
                      "--xla_force_host_platform_device_count=N)")


def use_devices(n: int | None) -> None:
  """Makes N devices available before JAX starts its backends.

  Raises:
    UsageError: for N < 1, or when JAX already runs with fewer devices.
  """
  if n is None:
    return
  if n < 1:
    raise UsageError(f"--devices {n}: expected a positive number")
  flag = f"--xla_force_host_platform_device_count={n}"
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count=")]
  os.environ["XLA_FLAGS"] = " ".join([*flags, flag])
  import jax

  have = jax.device_count()
  if have < n:
    raise UsageError(f"--devices {n}: JAX runs with {have} {jax.default_backend()} "
                     f"device(s) (on CPU, set XLA_FLAGS={flag} before JAX starts)")


def add_target_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("target (compile for a GPU or TPU this machine need not have)")
  g.add_argument("--target", metavar="NAME", default=None,
                 help="compile for this device instead of this machine: a GPU (h200, h100, "
                      "b200, a100, ... or a GpuTargetConfigProto text file; needs pip "
                      "install 'hlo-audit[gpu-target]') or a TPU (v5e, v6e, v5p, v4, or a "
                      "slice such as v5e:2x2 or v5p:2x2x1; needs pip install "
                      "'hlo-audit[tpu-target]'); hlo-audit targets lists them")
  g.add_argument("--gpus", type=int, default=None, metavar="N",
                 help="with --target: a topology of N GPUs and a mesh over them "
                      "(sharded programs show XLA:GPU's NCCL collectives)")
  g.add_argument("--autotune-results", metavar="FILE", default=None,
                 help="with --target: XLA autotune results dumped on a real GPU "
                      "(--xla_gpu_dump_autotune_results_to); default: not autotuned")


def use_target(args: argparse.Namespace):
  """The `--target` the flags ask for (None without one), checked before
  anything starts JAX: the CUDA plugin starts without a GPU only when JAX
  runs on the CPU (JAX_PLATFORMS=cpu, set here on a machine without an
  NVIDIA GPU unless the user chose a platform).

  Raises:
    UsageError: for --gpus or --autotune-results without --target, and
      --target with --devices.
    TargetError: for an unknown target or missing wheels (one line, with
      the pip command).
  """
  name = getattr(args, "target", None)
  gpus, results = getattr(args, "gpus", None), getattr(args, "autotune_results", None)
  if name is None:
    if gpus is not None or results is not None:
      raise UsageError("--gpus and --autotune-results need --target (e.g. --target h200)")
    return None
  if getattr(args, "devices", None):
    raise UsageError("--devices is for this machine's devices; with --target use --gpus")
  if not wheels.has_nvidia_gpu():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from hlo_audit._src.target.target import get_target

  target = get_target(name, gpus=gpus, autotune_results=results)
  wheels.require_for(target)
  return target


def target_prefix(args: argparse.Namespace) -> list[str]:
  """The target flags as given, for the footer's next commands."""
  out = []
  for flag, value in (("--target", getattr(args, "target", None)),
                      ("--gpus", getattr(args, "gpus", None)),
                      ("--autotune-results", getattr(args, "autotune_results", None))):
    if value is not None:
      out += [flag, str(value)]
  return out


_WHAT_IF_KEYS = ("donate", "remat", "drop", "fuse", "unsplit")


def replay_what_if(report: AuditReport, spec: str):
  """The what-if `--what-if` asks for: 'KEY=V1,V2;KEY=...' with KEY one of
  donate, remat, drop, fuse, unsplit (fuse takes finding numbers, 1-based)."""
  changes: dict[str, list] = {}
  for part in spec.split(";"):
    if not part.strip():
      continue
    key, sep, values = part.partition("=")
    key = key.strip()
    if not sep or key not in _WHAT_IF_KEYS:
      raise UsageError(f"--what-if {part!r}: expected KEY=V1,V2 with KEY one of "
                       + ", ".join(_WHAT_IF_KEYS))
    # Argument paths hold commas only inside brackets: split outside them.
    items, depth, cur = [], 0, ""
    for ch in values:
      depth += ch in "[(" 
      depth -= ch in "])"
      if ch == "," and depth == 0:
        items.append(cur.strip())
        cur = ""
      else:
        cur += ch
    items.append(cur.strip())
    changes.setdefault(key, []).extend(i for i in items if i)
  fuse = []
  for n in changes.pop("fuse", []):
    if not n.isdigit() or not 1 <= int(n) <= len(report.findings):
      raise UsageError(f"--what-if fuse={n}: expected a finding number from 1 to "
                       f"{len(report.findings)}")
    fuse.append(report.findings[int(n) - 1])
  return report.what_if(fuse=fuse, **changes)


def emit(report: AuditReport, args, out=None, *, prefix: list[str] | None = None,
         swap_hint: bool = False) -> ExitCode:
  """Writes the report as asked and returns the exit code."""
  from hlo_audit._src.report import terminal
  from hlo_audit._src.report.grouping import ranked_groups

  out = out or sys.stdout
  kinds = fail_on_classes(args.fail_on)
  sort = getattr(args, "sort", "time")
  min_time = getattr(args, "min_time", None)
  if min_time is not None and not kinds:
    raise UsageError("--min-time applies to --fail-on: name the classes that fail")
  if min_time is not None and report.timing is None:
    raise UsageError("--min-time needs a time estimate, and this report has none ("
                     + next((n for n in report.notes if n.startswith("time not estimated")),
                            "the device is unknown") + ")")
  if getattr(args, "what_if", None):
    report = report.with_what_if(replay_what_if(report, args.what_if))
  if args.json:
    write(out, report.to_json() + "\n")
  elif args.markdown:
    write(out, report.to_markdown() + "\n")
  else:
    width = layout.text_width(out, args.width)
    top = args.top if args.top is not None else terminal.TOP
    if args.all:
      lines = terminal.full_lines(report, width, sort=sort)
    else:
      swap = report.kernel_libraries[0] if swap_hint and report.kernel_libraries else None
      lines = terminal.compact_lines(report, width, top=top, sort=sort,
                                     hints=hints(prefix or ["hlo-audit"], swap))
    write(out, "\n".join(lines) + "\n")
  if args.html:
    try:
      report.to_html(args.html)
    except OSError as e:
      raise UsageError(f"cannot write {args.html!r}: {e.strerror}") from None
    if not (args.json or args.markdown):
      write(out, f"HTML report written to {args.html}\n")
  trace = getattr(args, "trace", None)
  if trace:
    if report.timing is None:
      raise UsageError("--trace needs a time estimate, and this report has none ("
                       + next((n for n in report.notes if n.startswith("time not estimated")),
                              "the device is unknown") + ")")
    try:
      report.to_trace(trace)
    except OSError as e:
      raise UsageError(f"cannot write {trace!r}: {e.strerror}") from None
    if not (args.json or args.markdown):
      write(out, f"estimated timeline written to {trace} (Chrome trace JSON)\n")
  if not kinds:
    return ExitCode.OK
  hits = [g for g in ranked_groups(report.findings, sort)
          if g.kind in kinds and g.actionable and g.bytes_saved >= args.min_bytes
          and (min_time is None or (g.time_saved or 0.0) >= min_time)]
  if hits:
    width = layout.text_width(sys.stderr, args.width)
    floor = " and ".join(filter(None, (
        f"saving >= {fmt_bytes(args.min_bytes)}" if args.min_bytes else "",
        f"saving >= {fmt_time(min_time)}" if min_time is not None else "")))
    floor = f" {floor}" if floor else ""
    print(f"hlo-audit: {sum(g.count for g in hits)} finding(s) of class "
          f"{', '.join(sorted({g.kind.slug for g in hits}))}{floor} (--fail-on):",
          file=sys.stderr)
    step = report.timing.step_time if report.timing is not None else None
    print("\n".join(terminal.group_lines(hits, width, step=step)), file=sys.stderr)
    return ExitCode.FINDINGS
  return ExitCode.OK


def write(out, text: str) -> None:
  """Writes `text` to `out` and flushes; when the reader has gone (`| head`),
  the rest of the output is dropped and the verb goes on to its exit code."""
  try:
    out.write(text)
    out.flush()
  except BrokenPipeError:
    reader_gone(out)


def reader_gone(out=None) -> None:
  """Points stdout at the null device once its reader has closed the pipe,
  so that later writes and the flush at exit neither raise nor print
  Python's "Exception ignored ... BrokenPipeError"."""
  out = out or sys.stdout
  if out is not sys.stdout and out is not sys.__stdout__:
    return
  try:
    fd = sys.stdout.fileno()
  except (OSError, ValueError):
    return
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, fd)
  os.close(devnull)


def describe_error(e: Exception, verbose: bool = False) -> str:
  """One line saying what is wrong with the input and where; with
  `verbose`, the context lines too."""
  if isinstance(e, HloParseError):
    kind = _bad_file_kind(e.source) if e.source else None
    where = f"{e.source}:" if e.source else ""
    line = kind or f"{where}{e.line}:{e.column}: {e.message}"
    return f"{line}\n{e}" if verbose else line
  text = str(e)
  return text if verbose else text.splitlines()[0] if text else type(e).__name__


def _bad_file_kind(path: str) -> str | None:
  """Says what a file is when it is plainly not HLO text; None otherwise."""
  try:
    with open(path, "rb") as f:
      head = f.read(1 << 16)
  except OSError:
    return None
  if not head.strip():
    return f"{path}: empty file, not HLO text"
  if b"\0" in head:
    return f"{path}: binary file, not HLO text"
  try:
    text = head.decode("utf-8")
  except UnicodeDecodeError:
    text = None
    if len(head) < (1 << 16):
      return f"{path}: binary file (not UTF-8), not HLO text"
  if text is not None and not any(w in text for w in ("HloModule", "ENTRY", " = ")):
    first = layout.elide(text.strip().splitlines()[0].strip(), 60)
    return f"{path}: not HLO text (no HloModule header, ENTRY computation or instruction); it starts with {first!r}"
  return None
