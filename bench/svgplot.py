"""Minimal, dependency-free SVG plotting for the benchmark scripts.

Only the Python standard library is used.  Two chart types are provided:

* ``line_chart`` -- one polyline with point markers per series, optional
  log2 x axis (e.g. reader counts 1, 4, 16, 64, 256).
* ``bar_chart``  -- grouped vertical bars with value labels; ``None`` marks
  a value that was not measured.

Both write a standalone ~720x420 SVG (white background, sans-serif), y axis
starting at 0 with ~5 "nice" ticks, and create the parent directory.
Negative and non-finite values are not plotted below 0 (bars are clamped,
line points that are non-finite are skipped).
"""
import math
import os
import sys
from xml.sax.saxutils import escape

W, H = 720, 420
LEFT, RIGHT, TOP = 64, 150, 44          # plot margins; legend lives in RIGHT
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _fmt(v, ref=None):
    """Compact number: 1200 -> '1200', 0.25 -> '0.25', 1.5e6 -> '1.5M'.

    ``ref`` (e.g. the top tick) picks the suffix so an axis stays uniform.
    """
    a = abs(v) if ref is None else max(abs(v), abs(ref))
    if v == 0:
        return "0"
    for lim, div, suf in ((1e12, 1e12, "T"), (1e9, 1e9, "G"), (1e6, 1e6, "M"),
                          (1e4, 1e3, "k")):
        if a >= lim:
            return ("%.3g" % (v / div)) + suf
    return ("%.0f" % v) if abs(v) >= 99.95 else ("%.3g" % v)


def _nice_ticks(vmax, n=5):
    """Ticks 0, s, 2s, ... covering vmax with s in {1,2,2.5,5} x 10^k."""
    if not (vmax > 0 and math.isfinite(vmax)):
        vmax = 1.0
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    count = max(1, int(math.ceil(vmax / step - 1e-9)))
    return [i * step for i in range(count + 1)]


def _tw(text, size):
    """Rough rendered width of text in px for a sans-serif font."""
    return 0.6 * size * len(text)


def _fit(text, max_px, size, min_size=9):
    """Shrink font (down to min_size), then truncate with an ellipsis."""
    text = str(text)
    while size > min_size and _tw(text, size) > max_px:
        size -= 1
    if _tw(text, size) > max_px:
        keep = max(1, int(max_px / (0.6 * size)) - 1)
        text = text[:keep] + "\u2026"
    return text, size


def _text(x, y, s, size=11, anchor="middle", extra=""):
    return ('<text x="%.1f" y="%.1f" font-size="%g" text-anchor="%s"%s>%s</text>'
            % (x, y, size, anchor, extra, escape(str(s))))


def _frame(title, ylabel, ymax_data, bottom, pad_top=1.0):
    """Common SVG head, title, y axis label, y grid/ticks. Returns (parts, yfun)."""
    pw, ph = W - LEFT - RIGHT, bottom - TOP
    ticks = _nice_ticks(ymax_data * pad_top)
    top = ticks[-1]
    yf = lambda v: bottom - ph * max(0.0, min(v, top)) / top
    t, ts = _fit(title, W - 20, 16, 10)
    yl, ys = _fit(ylabel, ph, 12, 9)
    p = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'viewBox="0 0 %d %d" font-family="sans-serif">' % (W, H, W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         _text(W / 2, 26, t, ts, extra=' font-weight="bold"'),
         _text(16, TOP + ph / 2, yl, ys,
               extra=' transform="rotate(-90 16 %.1f)"' % (TOP + ph / 2))]
    for v in ticks:
        y = yf(v)
        p.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                 % (LEFT, y, LEFT + pw, y))
        p.append(_text(LEFT - 6, y + 4, _fmt(v, top), 11, "end"))
    p.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
             % (LEFT, TOP, pw, ph))
    return p, yf


def _legend(p, labels):
    """Legend in the right margin; overflow collapses into '+N more'."""
    x0, y, rows = W - RIGHT + 14, TOP + 8, max(1, int((H - TOP - 70) / 18))
    for i, lab in enumerate(labels):
        if i == rows - 1 and len(labels) > rows:
            p.append(_text(x0, y + 4, "+%d more" % (len(labels) - i), 10, "start"))
            break
        c = COLORS[i % len(COLORS)]
        p.append('<rect x="%d" y="%d" width="12" height="10" fill="%s"/>' % (x0, y - 5, c))
        s, sz = _fit(lab, RIGHT - 34, 11, 9)
        p.append(_text(x0 + 17, y + 4, s, sz, "start"))
        y += 18


def _write(path, parts):
    parts.append("</svg>\n")
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def _finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def line_chart(path, title, xlabel, ylabel, series, xlog2=False, xticks=None):
    """Write an SVG line chart to ``path``.

    ``series`` is a list of ``(label, [(x, y), ...])``; each series becomes a
    coloured polyline with point markers and a legend entry.  With
    ``xlog2=True`` the x axis is log base 2 (x <= 0 is skipped).  ``xticks``
    lists the x values to label (default: union of all series' x values,
    thinned if labels would collide).  The y axis starts at 0.
    """
    bottom = H - 62
    pw = W - LEFT - RIGHT
    tx = (lambda x: math.log2(x)) if xlog2 else (lambda x: float(x))
    clean = []
    for lab, pts in series:
        pts = [(x, y) for x, y in pts if _finite(x) and _finite(y) and (x > 0 or not xlog2)]
        clean.append((lab, sorted(pts)))
    allp = [pt for _, pts in clean for pt in pts]
    p, yf = _frame(title, ylabel, max([y for _, y in allp] or [0]), bottom)
    if xticks is None:
        xticks = sorted({x for x, _ in allp})
    xticks = [x for x in xticks if _finite(x) and (x > 0 or not xlog2)]
    xs = [tx(x) for x, _ in allp] + [tx(x) for x in xticks]
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    pad = 0.04 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    xf = lambda x: LEFT + pw * (tx(x) - lo) / (hi - lo)
    if xticks:  # thin labels so they do not overlap
        widest = max(_tw(_fmt(x), 11) for x in xticks) + 8
        xs_px = sorted(xf(x) for x in xticks)
        gaps = [b - a for a, b in zip(xs_px, xs_px[1:])] or [pw]
        stride = max(1, int(math.ceil(widest / max(min(gaps), 1e-9))))
        stride = min(stride, len(xticks))
        for x in sorted(xticks)[::stride]:
            px = xf(x)
            p.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#444"/>'
                     % (px, bottom, px, bottom + 4))
            p.append(_text(px, bottom + 17, _fmt(x), 11))
    xl, xs_ = _fit(xlabel + (" (log2 scale)" if xlog2 else ""), pw, 12, 9)
    p.append(_text(LEFT + pw / 2, bottom + 40, xl, xs_))
    if not allp:
        p.append(_text(LEFT + pw / 2, (TOP + bottom) / 2, "no data", 14,
                       extra=' fill="#999"'))
    for i, (lab, pts) in enumerate(clean):
        c = COLORS[i % len(COLORS)]
        coords = " ".join("%.1f,%.1f" % (xf(x), yf(y)) for x, y in pts)
        if len(pts) > 1:
            p.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>'
                     % (coords, c))
        for x, y in pts:
            p.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>' % (xf(x), yf(y), c))
    _legend(p, [lab for lab, _ in clean])
    _write(path, p)


def bar_chart(path, title, ylabel, groups, series_labels, note=None):
    """Write an SVG grouped bar chart to ``path``.

    ``groups`` is a list of ``(group_label, [value_or_None, ...])`` with one
    value per entry of ``series_labels``.  Each bar is labelled with its value;
    ``None`` (or a non-finite value) draws no bar and a small "n/a" label.
    ``note`` is an optional line of text under the chart.  The y axis starts
    at 0; negative values are shown as labels on a zero-height bar.
    """
    bottom = H - 52
    pw = W - LEFT - RIGHT
    ns = max(1, len(series_labels))
    vals = [v for _, row in groups for v in row if _finite(v)]
    p, yf = _frame(title, ylabel, max(vals or [0]), bottom, pad_top=1.08)
    if not groups:
        p.append(_text(LEFT + pw / 2, (TOP + bottom) / 2, "no data", 14,
                       extra=' fill="#999"'))
    gw = pw / max(1, len(groups))
    bw = gw * 0.8 / ns
    for g, (glab, row) in enumerate(groups):
        gx = LEFT + g * gw + gw * 0.1
        s, sz = _fit(glab, gw - 4, 11, 8)
        p.append(_text(LEFT + g * gw + gw / 2, bottom + 16, s, sz))
        for i in range(ns):
            v = row[i] if i < len(row) else None
            cx = gx + (i + 0.5) * bw
            label, fill = (_fmt(v), "#222") if _finite(v) else ("n/a", "#999")
            if _finite(v):
                y = yf(v)
                p.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'
                         % (gx + i * bw + 0.5, y, max(bw - 1, 0.5), bottom - y,
                            COLORS[i % len(COLORS)]))
            else:
                y = bottom
            size = 10 if _finite(v) else 9
            if _tw(label, size) <= bw:
                p.append(_text(cx, y - 3, label, size, extra=' fill="%s"' % fill))
            else:  # too narrow: vertical label, inside the bar if no room above
                inside = y - _tw(label, size) - 3 < TOP
                ty = y + 3 if inside else y - 3
                p.append(_text(cx + size / 3, ty, label, size, "end" if inside else "start",
                               ' fill="%s" transform="rotate(-90 %.1f %.1f)"'
                               % ("white" if inside else fill, cx + size / 3, ty)))
    _legend(p, list(series_labels))
    if note:
        s, sz = _fit(note, W - 20, 11, 8)
        p.append(_text(10, H - 10, s, sz, "start", ' fill="#555"'))
    _write(path, p)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/svgplot-demo"
    readers = [1, 4, 16, 64, 256]
    line_chart(os.path.join(out, "line.svg"), "Read throughput vs readers <demo & test>",
               "readers", "reads/s",
               [("lock-free snapshot", [(r, 1.5e6 * r ** 0.3) for r in readers]),
                ("mutex", [(r, 1.2e6 / (1 + r / 64)) for r in readers]),
                ("a very long series label that must be truncated", [(16, 2.5e6)])],
               xlog2=True)
    bar_chart(os.path.join(out, "bar.svg"), "Startup time by dataset size", "ms",
              [("small", [12.5, 8.0, 0.25]), ("medium", [120, 95, None]),
               ("large dataset with a long name", [1200, 1010, None])],
              ["cold start", "warm start", "index only"],
              note="n/a = not measured; demo data only")
    line_chart(os.path.join(out, "empty.svg"), "Empty", "x", "y", [])
    bar_chart(os.path.join(out, "zeros.svg"), "All zeros", "y",
              [("a", [0, 0])], ["s1", "s2"])
    print("wrote demo SVGs to", out)
