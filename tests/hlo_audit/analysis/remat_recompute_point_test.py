"""The remat replay: a rematerialized buffer is kept until its first group
of uses, and its recomputed copy lives from the first later use (where the
backward pass needs it again) to the last."""

from __future__ import annotations

import hlo_audit
from hlo_audit._src.analysis.replay import remat_split

# a = exp(x) is read by b at step 2, then again by f at step 5 and h at
# step 7. Every value is 4 KiB but g and h (64 KiB each, one allocation
# that b, c and d also take turns in); x has its own allocation, and a and
# f are the heap: 64 + 4 + 8 KiB = 76 KiB at step 5.
MODULE = """
HloModule remat, is_scheduled=true

%fused_exp (p0: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  ROOT %e = f32[1024]{0} exponential(%p0)
}
%fused_tanh (p0.1: f32[1024]) -> f32[1024] {
  %p0.1 = f32[1024]{0} parameter(0)
  ROOT %t = f32[1024]{0} tanh(%p0.1)
}
%fused_neg (p0.2: f32[1024]) -> f32[1024] {
  %p0.2 = f32[1024]{0} parameter(0)
  ROOT %n = f32[1024]{0} negate(%p0.2)
}
%fused_sqrt (p0.3: f32[1024]) -> f32[1024] {
  %p0.3 = f32[1024]{0} parameter(0)
  ROOT %s = f32[1024]{0} sqrt(%p0.3)
}
%fused_add (p0.4: f32[1024], p1.4: f32[1024]) -> f32[1024] {
  %p0.4 = f32[1024]{0} parameter(0)
  %p1.4 = f32[1024]{0} parameter(1)
  ROOT %ad = f32[1024]{0} add(%p0.4, %p1.4)
}
%fused_wide (p0.5: f32[1024]) -> f32[16,1024] {
  %p0.5 = f32[1024]{0} parameter(0)
  ROOT %bc = f32[16,1024]{1,0} broadcast(%p0.5), dimensions={1}
}
%fused_mul (p0.6: f32[16,1024], p1.6: f32[1024]) -> f32[16,1024] {
  %p0.6 = f32[16,1024]{1,0} parameter(0)
  %p1.6 = f32[1024]{0} parameter(1)
  %b1 = f32[16,1024]{1,0} broadcast(%p1.6), dimensions={1}
  ROOT %m = f32[16,1024]{1,0} multiply(%p0.6, %b1)
}
ENTRY %main (x: f32[1024]) -> f32[16,1024] {
  %x = f32[1024]{0} parameter(0)
  %a = f32[1024]{0} fusion(%x), kind=kLoop, calls=%fused_exp
  %b = f32[1024]{0} fusion(%a), kind=kLoop, calls=%fused_tanh
  %c = f32[1024]{0} fusion(%b), kind=kLoop, calls=%fused_neg
  %d = f32[1024]{0} fusion(%c), kind=kLoop, calls=%fused_sqrt
  %f = f32[1024]{0} fusion(%d, %a), kind=kLoop, calls=%fused_add
  %g = f32[16,1024]{1,0} fusion(%f), kind=kLoop, calls=%fused_wide
  ROOT %h = f32[16,1024]{1,0} fusion(%g, %a), kind=kLoop, calls=%fused_mul
}
"""


def test_the_recomputed_copy_starts_at_the_first_later_use():
  r = hlo_audit.audit_hlo(MODULE)
  p = r.program
  assert [p.schedule.time[n] for n in ("b", "f", "h")] == [2, 5, 7]
  # Kept through b; recomputed for f, and live until h, its last reader.
  assert remat_split(p.dataflow, p.schedule, p.liveness.value_ranges, ("a", ())) == (2, 5, 7)


def test_a_remat_whose_copy_is_live_at_the_peak_saves_nothing():
  r = hlo_audit.audit_hlo(MODULE)
  assert r.peak_bytes == (64 + 4 + 8) << 10
  # The copy f reads at step 5 is back on the heap beside f: the same
  # 76 KiB. (Recomputed only at h, step 7, it would seem to save 4 KiB.)
  w = r.what_if(remat=["a"])
  assert w.changes == ("remat a",)
  assert w.peak_bytes == (64 + 4 + 8) << 10 and w.peak_saved == 0
