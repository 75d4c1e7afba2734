"""Sweep grids: parsing, grid files, the product, sharding and point ids."""

from __future__ import annotations

import hashlib
import json

import pytest

from hlo_audit._src.sweep.grid import (Grid, GridError, load_grid_file, parse_grid,
                                       parse_value, point_id, shard)


def test_parse_grid_is_the_product_last_name_fastest_with_typed_values():
  g = parse_grid(" batch = 1, 2 ; dtype=float32,bf16;scale=0.5;flag=true;act=none")
  assert g.names == ("batch", "dtype", "scale", "flag", "act")
  points = g.points()
  assert len(points) == 4
  assert points[0] == {"batch": 1, "dtype": "float32", "scale": 0.5, "flag": True,
                       "act": None}
  assert [(p["batch"], p["dtype"]) for p in points] == [
      (1, "float32"), (1, "bf16"), (2, "float32"), (2, "bf16")]


@pytest.mark.parametrize("text, message", [
    ("batch", "expected NAME=V1,V2"),
    ("batch=", "no values for 'batch'"),
    ("batch=1;batch=2", "names 'batch' twice"),
    ("2x=1", "is not a name"),
])
def test_parse_grid_errors_name_the_part(text, message):
  with pytest.raises(GridError, match=message):
    parse_grid(text)


def test_parse_value():
  assert parse_value("128") == 128 and parse_value("-3") == -3
  assert parse_value("1e3") == 1000.0 and parse_value("False") is False
  assert parse_value("null") is None and parse_value("gelu") == "gelu"


def test_empty_grid_is_one_default_point():
  assert Grid().points() == ({},)
  assert Grid().size == 1


def test_size_counts_points_without_making_them(monkeypatch):
  g = parse_grid(";".join(f"n{i}=" + ",".join(map(str, range(10))) for i in range(12)))
  g = Grid(axes=g.axes, extra=({"n0": 1}, {"n1": 2}))
  monkeypatch.setattr(Grid, "points", lambda self: pytest.fail("points made"))
  assert g.size == 10**12 + 2
  assert Grid(extra=({"a": 1},)).size == 1


def test_toml_file_with_grid_and_extra_points(tmp_path):
  p = tmp_path / "g.toml"
  p.write_text('[grid]\nbatch = [1, 2]\ndtype = ["float32"]\n\n'
               "[[points]]\nd_model = 96\nheads = 3\n")
  g = load_grid_file(p)
  assert g.points() == ({"batch": 1, "dtype": "float32"},
                        {"batch": 2, "dtype": "float32"},
                        {"d_model": 96, "heads": 3})
  assert g.names == ("batch", "dtype", "d_model", "heads")


def test_json_file_bare_table_and_cli_grid_replaces_its_lists(tmp_path):
  p = tmp_path / "g.json"
  p.write_text(json.dumps({"batch": [1, 2, 4], "seq": [16]}))
  g = load_grid_file(p).replace_axes(parse_grid("batch=8;vocab=32"))
  assert g.points() == ({"batch": 8, "seq": 16, "vocab": 32},)


@pytest.mark.parametrize("name, body, message", [
    ("g.yaml", "batch: [1]", "expected a .json or .toml file"),
    ("g.json", "{not json", "g.json"),
    ("g.json", '{"grid": {"b": [[1]]}}', "is not a number, boolean or string"),
    ("g.json", '{"grid": {}, "extra": 1}', "unknown top-level keys"),
    ("g.json", '{"zeta": 1, "grid": {}, "alpha": 2}',
     r"unknown top-level keys \['alpha', 'zeta'\] \(expected 'grid' and/or 'points'\)"),
    ("g.toml", "points = 3", "'points' must be a list of tables"),
    # A bare value: the file, the name, and that a list is expected.
    ("g.toml", '[grid]\nb = "notalist"',
     r"--grid-file '.*g\.toml', grid\.b: expected a list of values, got the string "
     r"'notalist' \(one value is a one-item list: b = \[\"notalist\"\]\)"),
    ("g.json", '{"grid": {"b": "notalist"}}',
     r"g\.json', grid\.b: expected a list of values, got the string 'notalist' "
     r"\(one value is a one-item list: \"b\": \[\"notalist\"\]\)"),
    ("g.json", '{"seq": 16}', r"grid\.seq: expected a list of values, got the number 16"),
    pytest.param("g.json", "[" * 100_000, "g.json", id="deeply-nested"),
])
def test_bad_grid_files(tmp_path, name, body, message):
  p = tmp_path / name
  p.write_text(body)
  with pytest.raises(GridError, match=message):
    load_grid_file(p)


def test_missing_grid_file():
  with pytest.raises(GridError, match="No such file"):
    load_grid_file("/nonexistent/g.toml")


def test_shards_are_disjoint_complete_and_balanced():
  items = list(range(20))
  parts = [shard(items, 3, i) for i in range(3)]
  assert sorted(sum(parts, [])) == items
  assert [len(p) for p in parts] == [7, 7, 6]
  for num_shards, index in ((3, 3), (3, -1), (0, 0), (-1, 0)):
    with pytest.raises(GridError, match=f"got shard_index={index}, num_shards={num_shards}"):
      shard(items, num_shards, index)


def test_point_id_is_stable_and_order_free():
  a = point_id({"target": "example", "params": {"batch": 1, "seq": 8}})
  b = point_id({"params": {"seq": 8, "batch": 1}, "target": "example"})
  assert a == b and len(a) == 12
  # The id is the hash of the canonical JSON: resume relies on it not changing.
  canonical = '{"params":{"batch":1,"seq":8},"target":"example"}'
  assert a == hashlib.sha256(canonical.encode()).hexdigest()[:12]
  assert a != point_id({"target": "example", "params": {"batch": 2, "seq": 8}})
