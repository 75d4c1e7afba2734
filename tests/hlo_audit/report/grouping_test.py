"""Finding groups add their members up once: a loop's trip count is in each
member's bytes already, never applied again by the group, its rank or JSON."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit import FindingKind

STEPS, N = 10, 64


def _layers(x, ws, bs):
  def body(h, wb):
    w, b = wb
    return jnp.tanh(h @ w + b), None

  for _ in range(2):  # two loops whose bodies share their source lines
    x, _ = jax.lax.scan(body, x, (ws, bs))
    x = x * 2.0
  return x


def test_a_group_of_loop_findings_sums_its_members_once():
  S = jax.ShapeDtypeStruct
  r = hlo_audit.audit(jax.jit(_layers), S((N, N), jnp.float32),
                      S((STEPS, N, N), jnp.float32), S((STEPS, N), jnp.float32))
  epilogues = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert len(epilogues) == 2, [(f.kind, f.boundary_shape, f.trip_count) for f in r.findings]
  per_trip = 2 * N * N * 4  # the f32[64,64] result written and read back
  for f in epilogues:
    assert f.trip_count == STEPS and f.bytes_saved == STEPS * per_trip
  (g,) = [g for g in r.groups if g.kind is FindingKind.UNFUSED_EPILOGUE]
  assert g.count == 2 and g.bytes_saved == 2 * STEPS * per_trip
  assert g.launches_removed == 2 * STEPS
  for group in r.groups:
    assert group.bytes_saved == sum(m.bytes_saved for m in group.members)
  # What JSON and the text report say of the group is the same sum.
  (row,) = [row for row in r.to_dict()["groups"] if row["class"] == "unfused-epilogue"]
  assert row["bytes_saved"] == g.bytes_saved and row["count"] == 2
  assert sum(r.findings[i].bytes_saved for i in row["members"]) == row["bytes_saved"]
  text = r.to_text(160)
  assert "640.00 KiB" in text and "x2" in text
  # Under the group's row, a row per member with its own boundary and bytes.
  from hlo_audit._src.report.text import group_rows  # pylint: disable=import-outside-toplevel
  rows = group_rows([g])
  assert [row[2] for row in rows] == ["x2 buffers"] + [
      "- " + (m.boundary or m.producer) for m in g.members]
  assert [row[5] for row in rows[1:]] == ["320.00 KiB"] * 2


def test_the_groups_left_out_say_their_time_when_any_of_them_has_one():
  import dataclasses  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.terminal import render_text  # pylint: disable=import-outside-toplevel
  S = jax.ShapeDtypeStruct
  r = hlo_audit.audit(jax.jit(_layers), S((N, N), jnp.float32),
                      S((STEPS, N, N), jnp.float32), S((STEPS, N), jnp.float32))

  def more_line(report):
    text = render_text(report, width=400, top=1)
    (line,) = [l for l in text.splitlines() if " more groups (" in l]
    return line

  assert " more and ~" in more_line(r)
  # The copy's estimate unknown: the others' time is still said.
  copy = next(f for f in r.findings if f.kind is FindingKind.STANDALONE_COPY)
  one_unknown = dataclasses.replace(r, findings=tuple(
      dataclasses.replace(f, time_saved=None) if f is copy else f for f in r.findings))
  assert " more and ~" in more_line(one_unknown)
  none_known = dataclasses.replace(r, findings=tuple(
      dataclasses.replace(f, time_saved=None) for f in r.findings))
  assert more_line(none_known).endswith(" more."), more_line(none_known)


def test_the_html_lists_groups_up_to_its_cap_and_counts_the_rest(monkeypatch):
  from hlo_audit._src.report import html  # pylint: disable=import-outside-toplevel
  S = jax.ShapeDtypeStruct
  r = hlo_audit.audit(jax.jit(_layers), S((N, N), jnp.float32),
                      S((STEPS, N, N), jnp.float32), S((STEPS, N), jnp.float32))
  n = len(r.groups)
  assert n >= 3
  monkeypatch.setattr(html, "MAX_GROUPS", n)  # exactly as many: all listed
  page = html.findings_html(r)
  assert "(the smallest)" not in page
  monkeypatch.setattr(html, "MAX_GROUPS", n - 1)
  assert '<p class="muted">1 more group (the smallest) is in the JSON report.</p>' in \
      html.findings_html(r)
  monkeypatch.setattr(html, "MAX_GROUPS", n - 2)
  assert '<p class="muted">2 more groups (the smallest) are in the JSON report.</p>' in \
      html.findings_html(r)
