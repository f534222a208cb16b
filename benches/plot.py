#!/usr/bin/env python3
"""Plots the benchmarks' own output as SVG, with nothing but the standard library.

    python3 benches/plot.py curve  benches/results/curve-postgres.txt  out.svg
    python3 benches/plot.py growth benches/results/growth-postgres.txt out.svg

`curve` reads CURVE lines (benches/curve.sh): ops/s against concurrent requests, one line per
variant. `growth` reads GROWTH lines (benches/programs/scale.rs): p50 and p99 latency against the number of
records in the table, one line per operation and percentile. Both x axes are logarithmic.
"""

import math
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]
W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 80, 190, 40, 60


def fields(line):
    out = {}
    for part in line.split()[1:]:
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def read(path, tag):
    """The `tag` lines of a benchmark's output, as fields; exits when there is none."""
    with open(path, encoding="utf-8") as f:
        rows = [fields(l) for l in f if l.startswith(tag + " ")]
    if not rows:
        sys.exit(f"no {tag} lines in {path}")
    return rows


def nice_max(v):
    if v <= 0:
        return 1
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def fmt(v):
    if v >= 1_000_000:
        return f"{v / 1_000_000:g}M"
    if v >= 1_000:
        return f"{v / 1_000:g}k"
    return f"{v:g}"


def svg(title, xlabel, ylabel, series, xs):
    """series: list of (name, [(x, y)]); xs: the x values to mark (log scale)."""
    ymax = nice_max(max((y for _, pts in series for _, y in pts), default=1))
    lx0, lx1 = math.log(min(xs)), math.log(max(xs))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + (0 if lx1 == lx0 else (math.log(x) - lx0) / (lx1 - lx0) * pw)

    def py(y):
        return TOP + ph - y / ymax * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="15">{title}</text>',
    ]
    for i in range(6):
        y = ymax * i / 5
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{fmt(y)}</text>'
        )
    for x in xs:
        out.append(
            f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{px(x):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{fmt(x)}</text>'
        )
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{H - 18}" text-anchor="middle">{xlabel}</text>'
    )
    out.append(
        f'<text transform="translate(18,{TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
        f"{ylabel}</text>"
    )
    out.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>'
    )
    for i, (name, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        pts = sorted(pts)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 14 + 20 * i
        out.append(
            f'<line x1="{LEFT + pw + 14}" x2="{LEFT + pw + 34}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{LEFT + pw + 40}" y="{ly}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def curve(path):
    rows = read(path, "CURVE")
    store = rows[0]["store"]
    series = {}
    for r in rows:
        series.setdefault(r["variant"], []).append(
            (int(r["concurrency"]), float(r["ops_per_sec"]))
        )
    xs = sorted({int(r["concurrency"]) for r in rows})
    return svg(
        f"{store}: throughput against concurrent requests",
        "concurrent requests",
        "requests per second",
        list(series.items()),
        xs,
    )


def growth(path):
    rows = read(path, "GROWTH")
    store = rows[0]["store"]
    series = {}
    for r in rows:
        for p in ("p50", "p99"):
            series.setdefault(f'{r["op"]} {p}', []).append(
                (int(r["records"]), float(r[f"{p}_us"]))
            )
    xs = sorted({int(r["records"]) for r in rows})
    return svg(
        f"{store}: latency against records in the table",
        "records in the table",
        "latency (µs)",
        list(series.items()),
        xs,
    )


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("curve", "growth"):
        sys.exit(__doc__)
    kind, src, dst = sys.argv[1:]
    text = curve(src) if kind == "curve" else growth(src)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
