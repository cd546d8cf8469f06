#!/usr/bin/env python3
"""Draws issue 14's rekey plot: the leader's bytes and the time until every member holds the
new key, against the group size, for each rekey method, from the "Rekey after one leave"
tables that `crates/cohort-group/benches/large_groups.rs` prints (identity mode rows).

    LARGE_GROUPS=rekey LARGE_GROUPS_SIZES=100 cargo bench -p cohort-group --bench large_groups > a.md
    ... one run per size (or LARGE_GROUPS_SIZES=100,300,...) ...
    scripts/plot-rekey.py a.md b.md ... > docs/rekey.svg

Both axes of the bytes panel are logarithmic; the time panel's n axis is logarithmic and its
time axis linear. Only the standard library: the SVG is written by hand.
"""
import math
import re
import sys

COLORS = {"one-message": "#d62728", "tree": "#1f77b4", "lkh": "#2ca02c"}


def read_rows(paths):
    """(method, n) -> (KiB less steady state, median virtual ms) from every table row."""
    rows = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) < 8 or cells[0] != "identity" or not cells[1].isdigit():
                    continue
                n = int(cells[1])
                method = cells[2].split(" ")[0]
                ms = float(re.match(r"[\d.]+", cells[4]).group(0))
                kib = float(cells[7])
                rows[(method, n)] = (kib, ms)
    return rows


class Panel:
    """One plot area with a log x axis and a log or linear y axis."""

    def __init__(self, x0, y0, w, h, xs, ys, ylog):
        self.x0, self.y0, self.w, self.h = x0, y0, w, h
        self.xlo, self.xhi = math.log10(min(xs)), math.log10(max(xs))
        self.ylog = ylog
        if ylog:
            self.ylo = math.floor(math.log10(min(ys)))
            self.yhi = math.ceil(math.log10(max(ys)))
        else:
            self.ylo, self.yhi = 0.0, nice_ceiling(max(ys))

    def px(self, x):
        return self.x0 + (math.log10(x) - self.xlo) / (self.xhi - self.xlo) * self.w

    def py(self, y):
        v = math.log10(y) if self.ylog else y
        return self.y0 + self.h - (v - self.ylo) / (self.yhi - self.ylo) * self.h


def nice_ceiling(v):
    step = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= v:
            return m * step
    return 10 * step


def fmt(v):
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def axes(out, p, xs, title, ylabel):
    out.append(f'<rect x="{p.x0}" y="{p.y0}" width="{p.w}" height="{p.h}" fill="none" stroke="#444"/>')
    for x in xs:
        X = p.px(x)
        out.append(f'<line x1="{X:.1f}" y1="{p.y0 + p.h}" x2="{X:.1f}" y2="{p.y0 + p.h + 4}" stroke="#444"/>')
        out.append(f'<text x="{X:.1f}" y="{p.y0 + p.h + 17}" text-anchor="middle">{fmt(x)}</text>')
    if p.ylog:
        ticks = [10 ** e for e in range(int(p.ylo), int(p.yhi) + 1)]
    else:
        ticks = [p.yhi * i / 5 for i in range(6)]
    for t in ticks:
        Y = p.py(t)
        out.append(f'<line x1="{p.x0}" y1="{Y:.1f}" x2="{p.x0 + p.w}" y2="{Y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{p.x0 - 6}" y="{Y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    out.append(f'<text x="{p.x0 + p.w / 2}" y="{p.y0 - 10}" text-anchor="middle" font-weight="bold">{title}</text>')
    out.append(f'<text x="{p.x0 + p.w / 2}" y="{p.y0 + p.h + 34}" text-anchor="middle">members (log scale)</text>')
    cy = p.y0 + p.h / 2
    out.append(f'<text x="{p.x0 - 52}" y="{cy}" text-anchor="middle" transform="rotate(-90 {p.x0 - 52} {cy})">{ylabel}</text>')


def series(out, p, rows, metric):
    for method, color in COLORS.items():
        pts = sorted((n, v[metric]) for (m, n), v in rows.items() if m == method)
        if not pts:
            continue
        path = " ".join(f"{p.px(n):.1f},{p.py(max(y, 1e-9)):.1f}" for n, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for n, y in pts:
            out.append(f'<circle cx="{p.px(n):.1f}" cy="{p.py(max(y, 1e-9)):.1f}" r="3" fill="{color}"/>')


def main():
    rows = read_rows(sys.argv[1:])
    if not rows:
        sys.exit("no identity-mode rekey rows found in the input")
    xs = sorted({n for _, n in rows})
    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="900" height="380" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    kib = Panel(90, 40, 330, 260, xs, [max(v[0], 0.1) for v in rows.values()], True)
    axes(out, kib, xs, "Leader's bytes for one leave", "KiB sent, less steady state (log)")
    series(out, kib, rows, 0)
    ms = Panel(540, 40, 330, 260, xs, [v[1] for v in rows.values()], False)
    axes(out, ms, xs, "Until every member holds the new key", "virtual ms (5 ms links)")
    series(out, ms, rows, 1)
    for k, (method, color) in enumerate(COLORS.items()):
        x = 250 + k * 160
        out.append(f'<line x1="{x}" y1="362" x2="{x + 24}" y2="362" stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{x + 30}" y="366">{method}{" (degree 4)" if method != "one-message" else ""}</text>')
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main()
