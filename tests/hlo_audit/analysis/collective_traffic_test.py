"""What each collective moves per device (ring algorithms), and how many
devices its replica groups hold, on one hand-written module of XLA's
spelling over 4 partitions."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit._src.analysis.collectives import group_size

_MODULE = """HloModule sharded, is_scheduled=true, num_partitions=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[1024], y: f32[4096]) -> (f32[4096], f32[1024], f32[1024], f32[4096], f32[1024]) {
  %x = f32[1024]{0} parameter(0)
  %y = f32[4096]{0} parameter(1)
  %ag = f32[4096]{0} all-gather(%x), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  %rs = f32[1024]{0} reduce-scatter(%y), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true, to_apply=%sum
  %ar = f32[1024]{0} all-reduce(%x), channel_id=3, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%sum
  %a2a = f32[4096]{0} all-to-all(%y), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}
  %cp = f32[1024]{0} collective-permute(%x), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  ROOT %t = (f32[4096]{0}, f32[1024]{0}, f32[1024]{0}, f32[4096]{0}, f32[1024]{0}) tuple(%ag, %rs, %ar, %a2a, %cp)
}
"""

KiB = 1024


def test_each_collective_moves_its_ring_share():
  got = {c.name: (c.opcode, c.group_size, c.bytes_sent, c.bytes_received, c.operand_bytes,
                  c.result_bytes) for c in hlo_audit.audit_hlo(_MODULE).collectives}
  assert got == {
      # Gathering 4 KiB shards into 16 KiB: each device receives the 3 shards
      # it lacks, and sends its own to each of them (along the ring).
      "ag": ("all-gather", 4, 12 * KiB, 12 * KiB, 4 * KiB, 16 * KiB),
      # Scattering 16 KiB: 3/4 of the operand passes through each device.
      "rs": ("reduce-scatter", 4, 12 * KiB, 12 * KiB, 16 * KiB, 4 * KiB),
      # An all-reduce over pairs is a reduce-scatter and an all-gather:
      # twice (n-1)/n of the operand.
      "ar": ("all-reduce", 2, 4 * KiB, 4 * KiB, 4 * KiB, 4 * KiB),
      "a2a": ("all-to-all", 4, 12 * KiB, 12 * KiB, 16 * KiB, 16 * KiB),
      # A permute sends its whole operand to one peer.
      "cp": ("collective-permute", 2, 4 * KiB, 4 * KiB, 4 * KiB, 4 * KiB),
  }


def _inst(replica_groups: str, attributes: str = "num_partitions=4"):
  text = _MODULE.replace("num_partitions=4", attributes).replace(
      "replica_groups=[2,2]<=[4]", f"replica_groups={replica_groups}")
  module = hlo_audit.parse_hlo(text)
  return module, module.entry.instruction("ar")


@pytest.mark.parametrize("groups, attributes, size", [
    ("[2,2]<=[4]", "num_partitions=4", 2),          # iota groups: [groups, size]
    ("[4,1]<=[4]", "num_partitions=4", 1),
    ("{{0,1,2},{3}}", "num_partitions=4", 3),         # listed: the first group's size
    ("{}", "num_partitions=4", 4),                    # everyone
    ("{}", "num_partitions=2, replica_count=8", 8),   # the larger of the two
    ("{}", "num_partitions=1", 1),
])
def test_a_group_size_is_read_from_the_replica_groups(groups, attributes, size):
  module, inst = _inst(groups, attributes)
  assert group_size(module, inst) == size


def test_a_single_device_collective_moves_nothing():
  one = _MODULE.replace("replica_groups=[2,2]<=[4]", "replica_groups=[4,1]<=[4]")
  (ar,) = [c for c in hlo_audit.audit_hlo(one).collectives if c.name == "ar"]
  assert (ar.group_size, ar.bytes_sent, ar.bytes_received) == (1, 0, 0)


_PRE = """HloModule pre

ENTRY %main (x: f32[1024]) -> f32[1024] {
  %x = f32[1024]{0} parameter(0), sharding={devices=[4]<=[4]}
  ROOT %n = f32[1024]{0} negate(%x)
}
"""


@pytest.mark.parametrize("attributes, read", [
    ("num_partitions=4", {0: "{devices=[4]<=[4]}"}),
    ("num_partitions=1", {}),
    ("", {}),  # no num_partitions at all: one partition
])
def test_parameter_shardings_come_from_before_optimization_only_when_partitioned(
    attributes, read):
  import types  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.analysis.collectives import _parameter_shardings  # pylint: disable=import-outside-toplevel
  header = "HloModule opt, is_scheduled=true" + (f", {attributes}" if attributes else "")
  optimized = hlo_audit.parse_hlo(_PRE.replace("HloModule pre", header).replace(
      ", sharding={devices=[4]<=[4]}", ""))
  program = types.SimpleNamespace(module=optimized, pre_optimization_text=_PRE)
  assert {k: str(v) for k, v in _parameter_shardings(program).items()} == read
