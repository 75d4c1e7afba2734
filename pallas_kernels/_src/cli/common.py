"""What the `python -m pallas_kernels` verbs share: exit codes and flag types."""

from __future__ import annotations

import argparse
import enum


class ExitCode(enum.IntEnum):
  """Exit codes scripts can rely on."""

  #: Every case passed (every kernel fits).
  OK = 0
  #: A case failed, or a kernel spills or exceeds shared memory.
  FAILED = 1
  #: Bad flags, or this machine cannot do what was asked.
  USAGE = 2


class UsageError(Exception):
  """A problem with the command line or this machine (exit code 2)."""


#: `--interpret` / `--require-kernel` values: "auto" lets the library decide.
TRI_STATE = {"auto": None, "true": True, "false": False}


def comma_list(text: str) -> list[str]:
  """"a,b" -> ["a", "b"] (as absl's list flags read it)."""
  return [item.strip() for item in text.split(",") if item.strip()]


def count(least: int):
  """An argparse type: an integer of at least `least`."""
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      value = None
    if value is None or value < least:
      raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {least}")
    return value
  return parse


def selected_ops(ops: list[str] | None) -> list[str]:
  """`--ops`, each checked against the registry (None: every registered op).

  Raises:
    UsageError: for an unknown op; the message lists the registered ones.
  """
  from pallas_kernels._src import registry  # noqa: PLC0415 - imports JAX

  if not ops:
    return list(registry.spec_names())
  for name in ops:
    try:
      registry.get_spec(name)
    except KeyError as e:
      raise UsageError(e.args[0]) from None
  return ops


def flag_names(name: str) -> tuple[str, ...]:
  """`--require-kernel` and `--require_kernel`: both spellings of a flag
  whose name has several words (the second is the old scripts')."""
  dashed = "--" + name.replace("_", "-")
  return (dashed,) if "_" not in name else (dashed, "--" + name)


def add_grads_flag(p: argparse.ArgumentParser) -> None:
  """`--grads` / `--no-grads` (absl's `--nograds` accepted too)."""
  p.add_argument("--grads", action=argparse.BooleanOptionalAction, default=True,
                 help="also check gradients (default: yes)")
  p.add_argument("--nograds", dest="grads", action="store_false", help=argparse.SUPPRESS)
