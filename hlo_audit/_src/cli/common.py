"""What every CLI verb shares: exit codes, output options, report emission."""

from __future__ import annotations

import argparse
import enum
import os
import sys

from hlo_audit._src.report.report import AuditReport, finding_kind

#: Text report width when stdout is not a terminal (and COLUMNS is unset).
PIPED_WIDTH = 160


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


def add_output_flags(p: argparse.ArgumentParser) -> None:
  out = p.add_argument_group("output")
  fmt = out.add_mutually_exclusive_group()
  fmt.add_argument("--json", action="store_true", help="print the report as JSON")
  fmt.add_argument("--markdown", action="store_true", help="print the report as Markdown")
  out.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
  out.add_argument("--fail-on", metavar="CLASS", action="append", default=[],
                   help="exit 1 if a finding of this class appears (repeatable or "
                        "comma-separated; e.g. unfused-epilogue,standalone-copy)")
  out.add_argument("--what-if", metavar="CHANGES", default=None,
                   help="replay the peak with changes made, e.g. 'donate=0,1', "
                        "'donate=params;remat=fusion.3', 'drop=NAME', 'fuse=2' (finding "
                        "numbers); prints the replayed peak beside the original")
  out.add_argument("--width", type=int, default=None,
                   help="width of the text report (default: the terminal's; "
                   f"{PIPED_WIDTH} when piped)")


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


_WHAT_IF_KEYS = ("donate", "remat", "drop", "fuse")


def replay_what_if(report: AuditReport, spec: str):
  """The what-if `--what-if` asks for: 'KEY=V1,V2;KEY=...' with KEY one of
  donate, remat, drop, fuse (fuse takes finding numbers, 1-based)."""
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


def emit(report: AuditReport, args, out=None) -> ExitCode:
  """Writes the report as asked and returns the exit code."""
  out = out or sys.stdout
  kinds = fail_on_classes(args.fail_on)
  if getattr(args, "what_if", None):
    report = report.with_what_if(replay_what_if(report, args.what_if))
  if args.json:
    out.write(report.to_json() + "\n")
  elif args.markdown:
    out.write(report.to_markdown() + "\n")
  else:
    from rich.console import Console

    from hlo_audit._src.report import terminal
    console = Console(file=out, width=args.width) if args.width else Console(file=out)
    if not args.width and not console.is_terminal and "COLUMNS" not in os.environ:
      # Piped to a file or pager: rich would wrap the tables at 80 columns.
      console = Console(file=out, width=PIPED_WIDTH)
    terminal.render_terminal(report, console)
  if args.html:
    try:
      report.to_html(args.html)
    except OSError as e:
      raise UsageError(f"cannot write {args.html!r}: {e.strerror}") from None
    if not (args.json or args.markdown):
      out.write(f"HTML report written to {args.html}\n")
  hits = [f for f in report.findings if f.kind in kinds]
  if hits:
    print(f"hlo-audit: {len(hits)} finding(s) of class "
          f"{', '.join(sorted({f.kind.slug for f in hits}))} (--fail-on)", file=sys.stderr)
    return ExitCode.FINDINGS
  return ExitCode.OK
