"""The HTML report of a comparison: a table and PNG plots (JCT CDF, utilisation, queue, GPUs)."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gandiva.run import RunResult  # noqa: E402
from gandiva.sim.engine import SimResult  # noqa: E402

COLUMNS = (
    ("mean_jct_s", "mean JCT", "duration"), ("p50_jct_s", "p50 JCT", "duration"),
    ("p95_jct_s", "p95 JCT", "duration"), ("p99_jct_s", "p99 JCT", "duration"),
    ("makespan_s", "makespan", "duration"), ("utilization", "GPU alloc.", "percent"),
    ("useful_utilization", "useful util.", "percent"), ("mean_queue_s", "mean queue", "duration"),
    ("mean_first_feedback_s", "first 100 mb", "duration"), ("suspends", "suspends", "int"),
    ("migrations", "migrations", "int"), ("packs", "packs", "int"),
    ("max_ftf_rho", "max FTF ρ", "ratio"), ("finished", "finished", "int"),
)


# the columns of the breakdown by job width (gandiva.metrics.by_width)
BREAKDOWN = ("mean_jct_s", "queue_s", "sliced_out_s", "running_s", "stalled_s", "alone_s")


def fmt(value: float, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "duration":
        v = float(value)
        if v < 120:
            return f"{v:.1f} s"
        if v < 7200:
            return f"{v / 60:.1f} min"
        return f"{v / 3600:.1f} h"
    if kind == "percent":
        return f"{100 * value:.1f}%"
    if kind == "ratio":
        return f"{value:.2f}"
    return f"{int(value):,}"


def _downsample(points: list[tuple[float, int, int, int]], n: int) -> list:
    if len(points) <= n:
        return points
    step = len(points) / n
    return [points[int(i * step)] for i in range(n)] + [points[-1]]


def plot_jct_cdf(results: dict[str, SimResult], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, res in results.items():
        jct = sorted(r.finish - r.spec.submit_time for r in res.jobs if r.finish is not None)
        if jct:
            ys = [(i + 1) / len(jct) for i in range(len(jct))]
            ax.step([j / 60 for j in jct], ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (min, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_series(results: dict[str, SimResult], path: Path, points: int) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for name, res in results.items():
        series = _downsample(res.series, points)
        if not series:
            continue
        t0 = res.span[0]
        xs = [(p[0] - t0) / 3600 for p in series]
        top.step(xs, [100 * p[1] / res.cluster_gpus for p in series], where="post", label=name)
        bottom.step(xs, [p[2] for p in series], where="post", label=name)
    top.set_ylabel("GPUs allocated (%)")
    top.set_title("Utilisation and queue over time")
    bottom.set_ylabel("waiting jobs")
    bottom.set_xlabel("hours since first submission")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_timeline(name: str, res: RunResult, path: Path, device: str = "GPU",
                  unit: float = 60.0) -> None:
    """One row per GPU, one coloured bar per job segment; hatched where the GPU is shared.
    ``unit``: seconds per unit of the time axis (60: minutes, 1: seconds)."""
    gpus = sorted({seg[0] for seg in res.timeline})
    row = {g: i for i, g in enumerate(gpus)}
    jobs = sorted({seg[1] for seg in res.timeline})
    cmap = plt.get_cmap("tab20")
    color = {j: cmap(i % 20) for i, j in enumerate(jobs)}
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.25 * len(gpus) + 1)))
    t0 = res.span[0]
    for gpu, job, start, end, shared in res.timeline:
        # jobs sharing a GPU are drawn in two half-height lanes so that both show
        y, h = ((row[gpu] - 0.4 + 0.4 * (jobs.index(job) % 2), 0.4) if shared
                else (row[gpu] - 0.4, 0.8))
        ax.broken_barh([((start - t0) / unit, max((end - start) / unit, 1e-3))], (y, h),
                       facecolors=color[job], hatch="//" if shared else None,
                       edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(gpus)))
    ax.set_yticklabels([f"{device} {g}" for g in gpus], fontsize=7)
    ax.set_xlabel(f"{'minutes' if unit == 60 else 'seconds'} since first submission")
    ax.set_title(f"{device} timeline: {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(
    out: Path, results: dict[str, SimResult], summaries: dict[str, dict[str, Any]],
    title: str, cluster: str,
) -> Path:
    """Write ``report.html`` and its PNGs into ``out``; return the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    plot_jct_cdf(results, out / "jct_cdf.png")
    plot_series(results, out / "utilization_queue.png", 2000)
    images = ["jct_cdf.png", "utilization_queue.png"]
    for i, (name, res) in enumerate(results.items()):
        if res.timeline:
            png = f"timeline_{i}.png"
            plot_timeline(name, res, out / png)
            images.append(png)
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in COLUMNS)
    rows = "".join(
        "<tr><td>" + html.escape(name) + "</td>"
        + "".join(f"<td>{fmt(s[key], kind)}</td>" for key, _, kind in COLUMNS) + "</tr>"
        for name, s in summaries.items()
    )
    widths = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{html.escape(w)}</td><td>{d['jobs']}</td>"
        + "".join(f"<td>{fmt(d[k], 'duration')}</td>" for k in BREAKDOWN) + "</tr>"
        for name, s in summaries.items() for w, d in s.get("by_width", {}).items())
    notes = sorted({n for r in results.values() for n in r.notes})
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    figs = "".join(f'<p><img src="{p}" alt="{p}"></p>' for p in images)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gandiva: {html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}
</style></head><body>
<h1>gandiva simulate: {html.escape(title)}</h1>
<p>cluster {html.escape(cluster)}</p>
<table><tr><th>policy</th>{head}</tr>{rows}</table>
<h2>Where jobs of each width spent their time (mean per finished job)</h2>
<table><tr><th>policy</th><th>GPUs</th><th>jobs</th>{"".join(
    f"<th>{html.escape(k.removesuffix('_s').replace('_', ' '))}</th>" for k in BREAKDOWN)}</tr>
{widths}</table>
<ul>{notes_html}</ul>
{figs}
</body></html>
"""
    path = out / "report.html"
    path.write_text(page)
    return path
