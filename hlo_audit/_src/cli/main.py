"""The `hlo-audit` command line.

Verbs live in their own modules (`example`, `file`, `run`, `diff`, `sweep`,
`targets`, `calibrate`). `run(argv)`
returns an `ExitCode` and is callable from Python; `main()` is the console
script (also `python -m hlo_audit`). The CLI uses argparse rather than absl
flags: absl's flags are process-global, which does not suit several verbs
with their own options, or calling `run` repeatedly from tests. The
benchmarks in scripts/ use absl.
"""

from __future__ import annotations

import argparse
import sys

from hlo_audit._src.cli import (calibrate_cmd, diff_cmd, example_cmd, file_cmd, run_cmd,
                                sweep_cmd, targets_cmd)
from hlo_audit._src.cli.common import (ExitCode, UsageError, check_output_flags,
                                       describe_error, reader_gone)
from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.report.safe import printable, printable_lines
from hlo_audit._src.target import wheels


class _Parser(argparse.ArgumentParser):
  """argparse, with a usage error said in one line (the usage itself is
  `--help`'s), its quoted input printable; subparsers are of this class too."""

  def error(self, message: str):
    self.exit(int(ExitCode.USAGE),
              f"{self.prog}: error: {printable(message)} (--help shows the usage)\n")


def build_parser() -> argparse.ArgumentParser:
  p = _Parser(
      prog="hlo-audit",
      description="See what XLA materializes in optimized HLO, and which fusions "
                  "would close the gaps.")
  sub = p.add_subparsers(dest="verb", metavar="VERB")
  sub.required = True
  for verb in (example_cmd, file_cmd, run_cmd, diff_cmd, sweep_cmd, targets_cmd,
               calibrate_cmd):
    verb.add_parser(sub)
  return p


def run(argv: list[str] | None = None) -> ExitCode:
  """Runs the CLI on `argv` (without the program name)."""
  parser = build_parser()
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # argparse printed the usage error
    return ExitCode.OK if e.code == 0 else ExitCode.USAGE
  verbose = getattr(args, "verbose", False)
  # Before anything starts JAX: a CUDA plugin (or libtpu) installed for
  # --target on a machine without its device would print a traceback (or
  # libtpu's warnings) on every run otherwise.
  wheels.cpu_unless_accelerator()
  wheels.import_jax_quietly()
  try:
    check_output_flags(args)
    _say_when_calibrating(args)
    return args.handler(args)
  except BrokenPipeError:  # stdout's reader stopped reading (`| head`): not an error
    reader_gone()
    return ExitCode.OK
  except (UsageError, HloAuditError, OSError) as e:
    # One line; --verbose adds the offending lines. The message quotes the
    # input (paths, HLO text): printable, so that it cannot act on the terminal.
    print(f"hlo-audit: error: {printable_lines(describe_error(e, verbose))}",
          file=sys.stderr)
    return ExitCode.USAGE
  except KeyboardInterrupt:
    return ExitCode.USAGE


def _say_when_calibrating(args: argparse.Namespace) -> None:
  """One line on stderr before a verb compiles for this machine's CPU the
  first time: the audit measures the CPU then (a few seconds, once)."""
  if args.verb not in ("example", "run") or getattr(args, "target", None):
    return
  from hlo_audit._src.target import calibration

  # Without starting JAX's backends: --devices sets their flags later.
  if not wheels.has_nvidia_gpu() and not calibration.cache_path().exists():
    print("hlo-audit: measuring this machine's CPU for the time model, once (a few "
          f"seconds; cached in {calibration.cache_path().parent})", file=sys.stderr)


def main() -> None:
  """Console script entry point."""
  code = run(sys.argv[1:])
  try:
    sys.stdout.flush()
  except BrokenPipeError:
    reader_gone()
  sys.exit(int(code))


if __name__ == "__main__":
  main()
