"""The report's plots, as inline SVG: where a person would rather look than read a table.

Matplotlib's object API (`Figure`, no pyplot), so nothing depends on a display or a global backend.
Each function returns the SVG markup, or None when the data has nothing to show.
"""

from __future__ import annotations

import io
import statistics
from collections import Counter

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

CLEAN_COLOUR, FOUND_COLOUR, NEUTRAL, SECOND = "#2b8a3e", "#c92a2a", "#1c7ed6", "#e8590c"


def _figure(height: float = 3.4, width: float = 7.5, left: float = 0.75) -> Figure:
    """Fixed margins in inches (`left` for the y labels): a layout engine would double the drawing time."""
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=left / width, right=1 - 0.25 / width, bottom=0.6 / height, top=1 - 0.35 / height)
    return fig


def _svg(fig: Figure, salt: str) -> str:
    """The SVG element alone; `salt` keeps element ids unique between the plots of one page."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def cases_over_time(log: list[dict]) -> str | None:
    if not log:
        return None
    fig = _figure(width=6)
    ax = fig.add_subplot()
    for outcome, colour, size in (("clean", CLEAN_COLOUR, 10), ("found", FOUND_COLOUR, 60)):
        points = [r for r in log if r["outcome"] == outcome]
        if points:
            ax.scatter([r["t"] for r in points], [r["i"] for r in points], s=size, c=colour, label=outcome,
                       zorder=3 if outcome == "found" else 2)
    first = next((r for r in log if r["outcome"] == "found"), None)
    if first:
        ax.annotate(f"first finding: case {first['i']}, {first['t']:.2f} s", (first["t"], first["i"]),
                    xytext=(-12, -12), textcoords="offset points", ha="right", va="top", color=FOUND_COLOUR)
    return _counted_axes(fig, ax, "seconds since the campaign started", "cases judged", "Cases over time, by outcome",
                         "cases")


def geometry(log: list[dict]) -> str | None:
    """Tokens against requests; a point's area grows with the number of cases drawn there."""
    if not log:
        return None
    fig = _figure(width=6)
    ax = fig.add_subplot()
    for graph, colour, label in ((False, NEUTRAL, "eager"), (True, SECOND, "graph replay")):
        counts = Counter((r["tokens"], r["requests"]) for r in log if r["graph"] == graph)
        if counts:
            keys = list(counts)
            ax.scatter([k[0] for k in keys], [k[1] for k in keys], s=[12 + 30 * counts[k] ** 0.5 for k in keys],
                       c=colour, alpha=0.55, label=f"{label} ({sum(counts.values())})", edgecolors="none")
    tokens = [r["tokens"] for r in log]
    if max(tokens) > 50 * max(1, min(tokens)):
        ax.set_xscale("symlog", linthresh=1)  # log-like, and an IDLE case's 0 tokens stays on the plot
    return _counted_axes(fig, ax, "tokens in the case (all batches)", "requests in the case",
                         "Geometry covered (area: number of cases)", "geometry")


def _counted_axes(fig, ax, xlabel: str, ylabel: str, title: str, name: str, legend: str = "upper left") -> str:
    """A plot whose y axis counts things: integer ticks, a light grid, the legend where `legend` says (top left)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend)
    return _svg(fig, name)


def detection_times(rows: list[dict]) -> str | None:
    """Seconds to the first finding per mutant; those killed only by a contract probe or alive say so."""
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: (r["seconds_to_detect"] is None, r["seconds_to_detect"] or 0))
    fig = _figure(1.1 + 0.28 * len(rows), left=0.3 + 0.075 * max(len(r["name"]) for r in rows))
    ax = fig.add_subplot()
    names = [r["name"] for r in rows]
    values = [r["seconds_to_detect"] or 0 for r in rows]
    colours = [FOUND_COLOUR if not r["killed"] else CLEAN_COLOUR for r in rows]
    ax.barh(names, values, color=colours)
    top = max(values) or 1.0
    for y, row in enumerate(rows):
        if not row["killed"]:
            note = "ALIVE: not detected"
        elif row["seconds_to_detect"] is None:
            note = "killed by a contract probe"
        else:
            note = f"{row['seconds_to_detect']:.2f} s, {row['examples_to_detect']} example(s)"
        ax.text((row["seconds_to_detect"] or 0) + top * 0.01, y, note, va="center", fontsize=8,
                color=FOUND_COLOUR if not row["killed"] else "#333333")
    ax.set_xlim(0, top * 1.6)
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the first finding")
    ax.set_title("Detection time per mutant")
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig, "mutants")


def fast_path_overlap(tally: dict) -> str | None:
    """How long before the forward's end the scheduler started on each batch's result (summary.json's
    `fast_path_overlap`): a histogram per group, publishing read-done or not, with the forward's end and the
    overlapped threshold marked. None when nothing was measured (the simulator)."""
    groups = [(name, colour, tally[key]["values_ms"]) for key, name, colour in (
        ("publishing", "published read-done", CLEAN_COLOUR), ("not_publishing", "did not publish", NEUTRAL))
        if "unmeasured" not in tally and tally[key]["values_ms"]]
    if not groups:
        return None
    fig = _figure(width=6)
    ax = fig.add_subplot()
    values = [v for _, _, kept in groups for v in kept]
    span = (min(values + [0.0]), max(values + [tally["overlapped_above_ms"]]))  # both marks in view
    for name, colour, kept in groups:
        ax.hist(kept, bins=40, range=span, color=colour, alpha=0.6, label=f"{name} ({len(kept)})")
    ax.axvline(0.0, color="#333333", linewidth=1, label="the forward's end")
    ax.axvline(tally["overlapped_above_ms"], color=FOUND_COLOUR, linewidth=1, linestyle="--",
               label=f"overlapped: more than {tally['overlapped_above_ms']:g} ms")
    return _counted_axes(fig, ax, "ms the scheduler started before the forward ended", "batches",
                         "The fast path in time", "overlap", legend="best")


def _roofline_ms(row: dict) -> float | None:
    """The time the row would take at the roofline: measured time scaled by the fraction achieved."""
    if row.get("ms") is None:
        return None
    if row.get("pct_roofline"):
        return row["ms"] * row["pct_roofline"] / 100
    if row.get("gbps") and row.get("roofline_gbps"):
        return row["ms"] * row["gbps"] / row["roofline_gbps"]
    return None


def kernel_vs_roofline(rows: list[dict]) -> str | None:
    """Measured kernel time against the roofline's bound, per kernel name, over tokens."""
    usable = [r for r in rows if r.get("tokens") and r.get("ms")]
    if not usable:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    palette = [NEUTRAL, SECOND, CLEAN_COLOUR, "#7048e8", "#868e96"]
    for n, name in enumerate(dict.fromkeys(r["name"] for r in usable)):
        series = sorted((r for r in usable if r["name"] == name), key=lambda r: r["tokens"])
        colour = palette[n % len(palette)]
        ax.plot([r["tokens"] for r in series], [r["ms"] for r in series], "o-", color=colour, label=f"{name} measured")
        bound = [(r["tokens"], _roofline_ms(r)) for r in series if _roofline_ms(r) is not None]
        if bound:
            ax.plot([b[0] for b in bound], [b[1] for b in bound], "--", color=colour, alpha=0.7,
                    label=f"{name} at the roofline")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("milliseconds")
    ax.set_title("Kernel time against the roofline")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _svg(fig, "kernel")


def sanitizer_slowdown(results: list[dict]) -> str | None:
    """Each tool's slowdown over the plain run: one point per case, a bar at the median."""
    by_tool: dict[str, list[float]] = {}
    for result in results:
        if result.get("slowdown"):
            by_tool.setdefault(result["tool"], []).append(result["slowdown"])
    if not by_tool:
        return None
    fig = _figure(1.2 + 0.45 * len(by_tool), left=0.3 + 0.075 * max(map(len, by_tool)))
    ax = fig.add_subplot()
    tools = sorted(by_tool)
    medians = [statistics.median(by_tool[t]) for t in tools]
    ax.barh(tools, medians, color=NEUTRAL, alpha=0.35, label="median")
    for y, tool in enumerate(tools):
        ax.scatter(by_tool[tool], [y] * len(by_tool[tool]), color=NEUTRAL, s=14, zorder=3)
        ax.text(medians[y], y + 0.3, f"{medians[y]:.1f}x", fontsize=8, va="center")
    ax.set_xlabel("slowdown over the plain run (x)")
    ax.set_title("compute-sanitizer slowdown per tool")
    ax.grid(axis="x", alpha=0.3)
    ax.invert_yaxis()
    return _svg(fig, "sanitizer")
