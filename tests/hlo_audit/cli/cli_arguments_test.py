"""Arguments the CLI reads itself, in-process: `--what-if KEY=V1,V2;KEY=...`
into the replay's changes (argument paths with commas inside brackets kept
whole, findings by their number), and the example's `--set NAME=VALUE`."""

from __future__ import annotations

import os
import types

import pytest

from hlo_audit._src.cli.common import UsageError, replay_what_if


def _report(findings=("f1", "f2", "f3")):
  return types.SimpleNamespace(findings=findings, what_if=lambda **changes: changes)


def test_keys_values_and_bracketed_paths():
  got = replay_what_if(_report(), "donate=params['w'][0, 1], x ;remat=h,(g, k),;fuse=3,1;drop=c;"
                                  "unsplit=s;donate=y")
  assert got == {"fuse": ["f3", "f1"], "donate": ["params['w'][0, 1]", "x", "y"],
                 "remat": ["h", "(g, k)"], "drop": ["c"], "unsplit": ["s"]}


def test_an_empty_spec_replays_nothing():
  assert replay_what_if(_report(), " ; ") == {"fuse": []}


@pytest.mark.parametrize("spec, message", [
    ("keep=x", "--what-if 'keep=x': expected KEY=V1,V2 with KEY one of donate, remat, drop, "
               "fuse, unsplit"),
    ("donate", "--what-if 'donate': expected KEY=V1,V2"),
    ("fuse=0", "--what-if fuse=0: expected a finding number from 1 to 3"),
    ("fuse=4", "--what-if fuse=4: expected a finding number from 1 to 3"),
    ("fuse=two", "--what-if fuse=two: expected a finding number from 1 to 3"),
])
def test_what_is_not_a_what_if_is_one_line_naming_it(spec, message):
  with pytest.raises(UsageError) as e:
    replay_what_if(_report(), spec)
  assert str(e.value).startswith(message)


def test_the_last_finding_is_in_range():
  assert replay_what_if(_report(), "fuse=3")["fuse"] == ["f3"]


@pytest.mark.parametrize("pair, message", [
    ("layers", "--set 'layers': expected NAME=VALUE with NAME one of batch, seq, d_model"),
    ("depth=2", "--set 'depth=2': expected NAME=VALUE with NAME one of batch"),
    ("layers=two", "--set 'layers=two': layers must be an integer"),
])
def test_an_example_setting_is_name_equals_value(pair, message):
  from hlo_audit._src.cli.example_cmd import config_from  # pylint: disable=import-outside-toplevel
  with pytest.raises(UsageError) as e:
    config_from([pair])
  assert str(e.value).startswith(message)
  assert config_from(["layers=3", "dtype=bfloat16"]).layers == 3


def test_one_device_is_a_count_and_zero_is_refused(monkeypatch):
  # In-process JAX already runs with its one CPU device: one is enough,
  # more is refused by what JAX has, none by the count itself.
  from hlo_audit._src.cli.common import use_devices  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1")
  use_devices(1)
  assert os.environ["XLA_FLAGS"].split() == [
      "--xla_cpu_foo=1", "--xla_force_host_platform_device_count=1"]
  with pytest.raises(UsageError, match="expected a positive number"):
    use_devices(0)
