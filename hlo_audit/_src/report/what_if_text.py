"""Text of a what-if replay: the peak before and after, and what is live."""

from __future__ import annotations

from hlo_audit._src.report.safe import printable
from hlo_audit._src.report.units import fmt_bytes, fmt_delta_bytes, fmt_time


def render_what_if(w, limit: int = 8) -> str:
  """A few lines: the changes, the peak before -> after, buffers at the peak."""
  pct = (f" ({100 * -w.peak_saved / w.baseline_peak_bytes:+.1f}%)"
         if w.baseline_peak_bytes else "")
  lines = [f"what-if: {'; '.join(w.changes) or 'no change'}",
           f"  peak {fmt_bytes(w.baseline_peak_bytes)} -> {fmt_bytes(w.peak_bytes)} "
           f"({fmt_delta_bytes(-w.peak_saved)}){pct} at step {w.peak_time}"]
  if w.step_time is not None and w.baseline_step_time:
    change = (w.step_time - w.baseline_step_time) / w.baseline_step_time
    lines.append(f"  estimated step {fmt_time(w.baseline_step_time)} -> "
                 f"{fmt_time(w.step_time)} ({100 * change:+.1f}%)")
  if w.live_at_peak:
    shown = ", ".join(w.live_at_peak[:limit])
    more = f", ... {len(w.live_at_peak) - limit} more" if len(w.live_at_peak) > limit else ""
    lines.append(f"  live at the new peak: {shown}{more}")
  lines += [f"  note: {n}" for n in w.notes]
  # The changes, notes and buffers name the input's instructions.
  return "\n".join(printable(line) for line in lines)
