"""Sweep plots (PNG, matplotlib's Agg canvas): bytes a fusion would save and
materialized bytes, peak memory (ours and XLA's), the estimated step time and
its split, and kernel speedup, each against one grid name, with a line per
combination of the other varying names.

matplotlib is imported inside the functions (hlo_audit itself does not need
it), and only through `Figure` and the Agg canvas: no pyplot, no global
backend switch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hlo_audit._src.sweep.grid import GridError

#: Lines drawn per plot at most (the rest are named in the title).
MAX_SERIES = 12


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def varying(records: Sequence[Mapping], names: Sequence[str]) -> list[str]:
  """Names (of `names`, then any other parameter) whose value differs
  between records."""
  all_names = list(names)
  for r in records:
    all_names += [n for n in r["params"] if n not in all_names]
  out = []
  for n in all_names:
    values = {repr(r["params"].get(n)) for r in records}
    if len(values) > 1:
      out.append(n)
  return out


def choose_x(records: Sequence[Mapping], names: Sequence[str],
             plot_x: str | None = None) -> str | None:
  """The x axis: `plot_x`, else the numeric varying name with the most
  distinct values (the first such in grid order), else the first varying one.

  Raises:
    GridError: if `plot_x` is not a parameter of the records.
  """
  vary = varying(records, names)
  if plot_x is not None:
    if not any(plot_x in r["params"] for r in records):
      raise GridError(f"--plot_x {plot_x!r} is not a parameter of the sweep's points")
    return plot_x
  numeric = [n for n in vary
             if all(_is_number(r["params"].get(n)) for r in records)]
  pool = numeric or vary
  if not pool:
    return None
  return max(pool, key=lambda n: (len({repr(r["params"].get(n)) for r in records}),
                                  -pool.index(n)))


def _series(records, x: str | None, names: Sequence[str]):
  """[(label, [records sorted by x])], one per combination of the other
  varying names."""
  others = [n for n in varying(records, names) if n != x]
  groups: dict[tuple, list] = {}
  for r in records:
    key = tuple(repr(r["params"].get(n)) for n in others)
    groups.setdefault(key, []).append(r)
  out = []
  for rs in groups.values():
    label = ", ".join(f"{n}={rs[0]['params'].get(n)}" for n in others) or "all points"
    out.append((label, rs))
  return out


def _xvalues(records, x):
  """x positions and tick labels (numbers as they are; others by order)."""
  if x is None:
    return {id(r): i for i, r in enumerate(records)}, None
  values = [r["params"].get(x) for r in records]
  if all(_is_number(v) for v in values):
    return {id(r): r["params"][x] for r in records}, None
  order: list[str] = []
  for v in values:
    if str(v) not in order:
      order.append(str(v))
  return {id(r): order.index(str(r["params"].get(x))) for r in records}, order


def tick_bytes(v: float) -> str:
  """A compact byte label for ticks: 256 KiB, 1.5 MiB."""
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(v) < 1024 or unit == "TiB":
      return f"{v:.3g} {unit}"
    v /= 1024
  return f"{v:.3g} TiB"  # pragma: no cover


def tick_time(v: float) -> str:
  """A compact time label for ticks: 850 ns, 12.5 us, 2 s."""
  for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
    if abs(v) >= scale:
      return f"{v / scale:.3g} {unit}"
  return "0" if v == 0 else f"{v / 1e-9:.3g} ns"


def _style_axes(ax, x, xs_all, categories, ylabel, byte_axis: bool, ys_all,
                time_axis: bool = False):
  from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

  ax.set_xlabel(x or "point")
  ax.set_ylabel(ylabel)
  ax.grid(True, alpha=0.3)
  if categories is not None:
    ax.set_xticks(range(len(categories)), categories)
  else:
    xs = sorted(set(xs_all))
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
      ax.set_xscale("log", base=2)
    if 0 < len(xs) <= 12:
      ax.set_xticks(xs, [f"{v:g}" for v in xs])
      ax.xaxis.set_minor_locator(NullLocator())
  ys = [y for y in ys_all if y is not None and y > 0]
  log_y = bool(ys) and max(ys) / min(ys) > 50
  if log_y:
    ax.set_yscale("log", base=2 if byte_axis else 10)
  if time_axis:
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_time(v)))
  if not byte_axis:
    return
  if log_y:
    ax.yaxis.set_major_locator(LogLocator(base=2, numticks=8))
    ax.yaxis.set_minor_locator(NullLocator())
  else:
    # Round numbers of the unit the axis reaches (KiB, MiB, ...), not of bytes.
    lo, hi = ax.get_ylim()
    unit = 1024 ** max(0, int(math.log(max(hi, 1.0), 1024)))
    ticks = MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(lo / unit, hi / unit)
    ax.set_yticks([t * unit for t in ticks if lo <= t * unit <= hi])
    ax.set_ylim(lo, hi)
  ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_bytes(v)))


def _new_figure(ncols: int = 1):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(figsize=(6.4 * ncols, 4.4), dpi=100, layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def _line_plot(ax, series, x, get, *, style="-o", label_suffix="", colors=None):
  """Draws one metric for every series; returns every x and y drawn."""
  xs_all, ys_all = [], []
  pos, categories = _xvalues([r for _, rs in series for r in rs], x)
  shown = series[:MAX_SERIES]
  for i, (label, rs) in enumerate(shown):
    pts = sorted(((pos[id(r)], get(r)) for r in rs if get(r) is not None),
                 key=lambda t: t[0])
    if not pts:
      continue
    xs, ys = zip(*pts)
    color = colors[i] if colors else None
    # Earlier lines wider, so a line equal to a later one still shows beneath it.
    wide = (len(shown) - 1 - i) / max(1, len(shown) - 1)
    ax.plot(xs, ys, style, label=label + label_suffix, color=color,
            linewidth=1.2 + 2.4 * wide, markersize=4 + 3 * wide)
    xs_all += xs
    ys_all += ys
  return xs_all, ys_all, categories


def _title(base: str, series) -> str:
  if len(series) > MAX_SERIES:
    return f"{base} (first {MAX_SERIES} of {len(series)} lines)"
  return base


def unavailable_reason() -> str | None:
  """Why plots cannot be drawn here (matplotlib, an optional extra), or None."""
  import importlib.util

  if importlib.util.find_spec("matplotlib") is None:
    return "matplotlib is not installed (pip install 'hlo-audit[plot]')"
  return None


def plot_sweep(records: Sequence[Mapping], out_dir: str, names: Sequence[str],
               plot_x: str | None = None, title: str = "") -> list[str]:
  """Writes bytes.png, peak.png, and time.png (when any point has an
  estimated step) and speedup.png (when any point was timed) into `out_dir`;
  returns their paths. Only points that finished ok are drawn.

  Raises:
    GridError: if `plot_x` is not a parameter of the records.
  """
  ok = [r for r in records if r.get("status") == "ok" and r.get("audit")]
  if not ok:
    return []
  x = choose_x(ok, names, plot_x)
  series = _series(ok, x, names)
  written = []
  palette = [f"C{i}" for i in range(10)] + ["#444444", "#999999"]

  def audit(key):
    return lambda r: r["audit"].get(key)

  # Bytes a fusion would save, next to what is materialized.
  fig = _new_figure(2)
  ax1, ax2 = fig.subplots(1, 2)
  for ax, key, name in ((ax1, "bytes_saved", "HBM traffic a fusion would save (bytes moved per run)"),
                        (ax2, "materialized_bytes", "materialized intermediates")):
    xs, ys, cats = _line_plot(ax, series, x, audit(key), colors=palette)
    _style_axes(ax, x, xs, cats, name, True, ys)
    ax.set_title(_title(name, series), fontsize=10)
  ax1.legend(fontsize=7)
  fig.suptitle(f"{title}: bytes against {x or 'point'}" if title else "", fontsize=11)
  written.append(_save(fig, out_dir, "bytes.png"))

  # Peak memory, ours (solid) and XLA's (dashed).
  fig = _new_figure()
  ax = fig.subplots()
  xs, ys, cats = _line_plot(ax, series, x, audit("peak_bytes"), colors=palette)
  xs2, ys2, _ = _line_plot(ax, series, x, audit("xla_peak_bytes"), style="--x",
                           label_suffix=" (XLA)", colors=palette)
  _style_axes(ax, x, xs + xs2, cats, "peak memory", True, ys + ys2)
  ax.set_title(_title(f"{title}: peak (ours solid, XLA's dashed) against {x or 'point'}",
                      series), fontsize=10)
  ax.legend(fontsize=7)
  written.append(_save(fig, out_dir, "peak.png"))

  estimated = [r for r in ok if r["audit"].get("step_time") is not None]
  if estimated:
    written.append(_plot_time(estimated, out_dir, x, names, title, palette))

  timed = [r for r in ok if r.get("timing")]
  if timed:
    tseries = _series(timed, x, names)
    fig = _new_figure()
    ax = fig.subplots()
    xs, ys, cats = _line_plot(ax, tseries, x,
                              lambda r: r["timing"].get("speedup"), colors=palette)
    _style_axes(ax, x, xs, cats, "speedup (XLA time / kernel time)", False, ys)
    ax.axhline(1.0, color="#cf222e", linewidth=1, linestyle=":")
    note = ""
    if any(r["timing"].get("interpret") for r in timed):
      note = "\ninterpret mode: the kernel was emulated; these timings mean nothing"
    ax.set_title(_title(f"{title}: kernel speedup against {x or 'point'}", tseries) + note,
                 fontsize=10)
    ax.legend(fontsize=7)
    written.append(_save(fig, out_dir, "speedup.png"))
  return written


#: The parts of the estimated step drawn in time.png: (audit key, label, style).
_SPLIT = (("memory_time", "memory", "-o"), ("compute_time", "compute", "--x"),
          ("launch_time", "launch", ":^"), ("communication_time", "communication", "-.s"))


def _plot_time(records, out_dir, x, names, title, palette) -> str:
  """time.png: the estimated step per point (left) and its split by what
  bounds it (right), on the device the records name."""
  from matplotlib.lines import Line2D

  series = _series(records, x, names)
  devices = sorted({str(r["audit"].get("time_device") or "?") for r in records})
  fig = _new_figure(2)
  ax1, ax2 = fig.subplots(1, 2)
  xs, ys, cats = _line_plot(ax1, series, x, lambda r: r["audit"]["step_time"],
                            colors=palette)
  _style_axes(ax1, x, xs, cats, "estimated step time", False, ys, time_axis=True)
  ax1.set_title(_title("estimated step (seconds per run)", series), fontsize=10)
  ax1.legend(fontsize=7)
  xs_all, ys_all, keys = [], [], []
  for key, label, style in _SPLIT:
    if not any(r["audit"].get(key) for r in records):
      continue  # (communication: none on one device)
    xs, ys, cats = _line_plot(ax2, series, x, lambda r, k=key: r["audit"].get(k),
                              style=style, colors=palette)
    xs_all += xs
    ys_all += ys
    # The colours are the left panel's series; the legend names the parts.
    keys.append(Line2D([], [], color="#444444", linestyle=style.rstrip("ox^s"),
                       marker=style[-1], label=label))
  _style_axes(ax2, x, xs_all, cats, "part of the step", False, ys_all, time_axis=True)
  ax2.set_title(_title("the step's split by what bounds it", series), fontsize=10)
  ax2.legend(handles=keys, fontsize=7)
  fig.suptitle(f"{title + ': ' if title else ''}estimated step on {', '.join(devices)} "
               f"against {x or 'point'}", fontsize=11)
  return _save(fig, out_dir, "time.png")


def _save(fig, out_dir: str, name: str) -> str:
  path = os.path.join(out_dir, name)
  fig.savefig(path)
  return path


def plot_data(records: Sequence[Mapping[str, Any]], names: Sequence[str],
              plot_x: str | None = None, metric: str = "bytes_saved"
              ) -> dict[str, list[tuple]]:
  """The (series label, x, y) points `plot_sweep` draws of an audit summary's
  `metric` ("bytes_saved", "peak_bytes", "step_time", ...), for tests and
  tables; points without the metric are left out, as the plots leave them."""
  ok = [r for r in records if r.get("status") == "ok" and r.get("audit")]
  x = choose_x(ok, names, plot_x)
  has = [r for r in ok if r["audit"].get(metric) is not None]
  pos, _ = _xvalues(has, x)
  return {label: sorted((pos[id(r)], r["audit"][metric]) for r in rs)
          for label, rs in _series(has, x, names)}
