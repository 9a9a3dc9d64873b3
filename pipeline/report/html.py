"""The report as ONE self-contained HTML page: the numbers as tables, the plots as inline PNGs.

Plots are drawn with matplotlib's object API on the Agg canvas (no pyplot state, no display),
and embedded as base64 data URIs so that the page can be mailed, attached to a ticket or
opened from a bucket without its neighbours. A plot with no data becomes a sentence saying
why, not an empty frame. A small script records, once the page has loaded, how many images
decoded: the browser test reads it, and a person never sees it.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from pipeline.report.stats import Comparison, RunStats, Section

RUN_COLOUR, BASE_COLOUR, REF_COLOUR = "#1f77b4", "#ff7f0e", "#444444"


@dataclass
class Plot:
    title: str
    caption: str
    png: bytes | None  # None: no data
    no_data: str = ""


def _figure() -> tuple[Figure, object]:
    fig = Figure(figsize=(6.4, 3.6), dpi=110, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _finite(*arrays: np.ndarray) -> list[np.ndarray]:
    keep = np.ones(len(arrays[0]), dtype=bool)
    for a in arrays:
        keep &= np.isfinite(a)
    return [a[keep] for a in arrays]


def _histogram(values: np.ndarray, xlabel: str, mark: float | None, mark_label: str,
               bins: int | Sequence[float] = 20, reference: float | None = None, ref_label: str = "") -> bytes:
    fig, ax = _figure()
    ax.hist(values, bins=bins, color=RUN_COLOUR, edgecolor="white")
    if mark is not None:
        ax.axvline(mark, color="black", linewidth=1.5, label=mark_label)
    if reference is not None:
        ax.axvline(reference, color=REF_COLOUR, linestyle="--", linewidth=1, label=ref_label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("items")
    ax.yaxis.get_major_locator().set_params(integer=True)
    if mark is not None or reference is not None:
        ax.legend(loc="best", fontsize="small")
    return _png(fig)


def _scatter(series: list[tuple[str, str, np.ndarray, np.ndarray]], xlabel: str, ylabel: str,
             hline: float | None = None) -> bytes | None:
    series = [(name, colour, *_finite(x, y)) for name, colour, x, y in series]
    series = [s for s in series if len(s[2])]
    if not series:
        return None
    fig, ax = _figure()
    for name, colour, x, y in series:
        ax.scatter(x, y, s=18, alpha=0.7, color=colour, label=name)
    if hline is not None:
        ax.axhline(hline, color=REF_COLOUR, linestyle="--", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend(loc="best", fontsize="small")
    return _png(fig)


def plots(stats: RunStats, comparison: Comparison | None = None, baseline: RunStats | None = None) -> list[Plot]:
    """The page's pictures, in reading order."""
    out: list[Plot] = []

    def add(title: str, caption: str, draw: Callable[[], bytes | None], no_data: str) -> None:
        png = draw()
        out.append(Plot(title, caption, png, "" if png is not None else no_data))

    acc = _finite(stats.item_acceptance)[0]
    add("Acceptance per item", "Share of each item's drafted tokens that the target accepted.",
        lambda: _histogram(acc, "acceptance rate", stats.summary.acceptance, "whole run", bins=np.linspace(0, 1, 21))
        if len(acc) else None,
        "No data: no generated items." if not stats.results else
        "No data: nothing was drafted in this run (the target alone), so there is no acceptance to show.")

    tps = _finite(stats.item_tokens_per_step)[0]
    add("Tokens per target step", "New tokens per target forward pass, per item: 1 is the target alone; "
        "each accepted draft token adds to it.",
        lambda: _histogram(tps, "tokens per target step", stats.summary.tokens_per_step, "whole run")
        if len(tps) else None,
        "No data: no item took a target step.")

    def series(x: str) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
        s = [("this run", RUN_COLOUR, getattr(stats, x), stats.item_latency)]
        if baseline is not None:
            s.append(("baseline", BASE_COLOUR, getattr(baseline, x), baseline.item_latency))
        return s

    add("Latency against prompt length", "Each item's generation time (prefill + decode) by its prompt length.",
        lambda: _scatter(series("item_prompt_tokens"), "prompt tokens", "latency (s)"),
        "No data: no generated items.")
    add("Latency against output length", "Each item's generation time by the number of tokens it generated.",
        lambda: _scatter(series("item_new_tokens"), "new tokens", "latency (s)"),
        "No data: no generated items.")

    no_base = "No data: no baseline given (--baseline PREFIX of a --drafter none run on the same prompts)."
    speedup = _finite(comparison.item_speedup)[0] if comparison is not None else np.array([])
    add("Speed-up per item against the baseline", "Baseline latency / this run's latency, per prompt in both "
        "runs. Left of the dashed line at 1, speculation cost time.",
        lambda: _histogram(speedup, "speed-up (x)", comparison.speedup, "whole run", reference=1.0,
                           ref_label="no change") if len(speedup) else None,
        no_base if comparison is None else "No data: no prompt is in both runs.")
    if comparison is not None:
        # the run's acceptance for the same items as item_speedup (compare() keeps run order)
        add("Speed-up against acceptance", "Per item: where acceptance is low, drafting is wasted work.",
            lambda: _scatter([("items", RUN_COLOUR, _matched(stats, comparison), comparison.item_speedup)],
                             "acceptance rate", "speed-up (x)", hline=1.0),
            "No data: no item in both runs had drafts.")

    failures = stats.failures_by_type
    add("Failed rows by type", "Input rows that could not be generated, by error type.",
        lambda: _bars(failures) if failures else None, "No failed rows: every input row was generated.")
    return out


def _matched(stats: RunStats, comparison: Comparison) -> np.ndarray:
    return stats.item_acceptance[comparison.item_run_rows]


def _bars(counts: dict[str, int]) -> bytes:
    fig, ax = _figure()
    names = list(counts)[::-1]
    ax.barh(names, [counts[n] for n in names], height=0.5, color="#d62728")
    ax.set_ylim(-0.75, len(names) - 0.25)  # a lone bar stays a bar, not a red block
    ax.set_xlim(0, max(counts.values()) * 1.15)
    ax.set_xlabel("rows")
    ax.xaxis.get_major_locator().set_params(integer=True)
    for i, n in enumerate(names):
        ax.text(counts[n], i, f" {counts[n]}", va="center")
    return _png(fig)


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto; max-width: 1400px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin: 1.4rem 0 .4rem; }
.sub { color: #666; margin-top: 0; }
.tables { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 0 2rem; }
table { border-collapse: collapse; width: 100%; font-size: .92rem; }
td { padding: .25rem .5rem; border-bottom: 1px solid #eee; vertical-align: top; }
td:first-child { color: #555; width: 45%; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 1.2rem; }
figure { margin: 0; border: 1px solid #ddd; border-radius: 6px; padding: .6rem; background: #fff; }
figure h3 { font-size: 1rem; margin: 0 0 .3rem; }
figure img { width: 100%; height: auto; display: block; }
figcaption { color: #555; font-size: .85rem; margin-top: .3rem; }
.no-data { height: 200px; display: flex; align-items: center; justify-content: center; text-align: center;
           background: #f6f6f6; color: #666; padding: 1rem; border-radius: 4px; }
"""

# Records, after load, how many images decoded: read by tests/test_report.py through --dump-dom.
_CHECK = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  var el = document.getElementById("render-check");
  el.setAttribute("data-images", String(imgs.length));
  el.setAttribute("data-loaded", String(ok.length));
});
"""


def page(title: str, subtitle: str, parts: Sequence[Section], figures: Sequence[Plot]) -> str:
    e = html.escape
    tables = "".join(
        f"<div><h2>{e(name)}</h2><table>"
        + "".join(f"<tr><td>{e(label)}</td><td>{e(value)}</td></tr>" for label, value in rows)
        + "</table></div>"
        for name, rows in parts)
    figs = []
    for p in figures:
        body = (f'<img alt="{e(p.title)}" src="data:image/png;base64,{base64.b64encode(p.png).decode()}">'
                if p.png is not None else f'<div class="no-data">{e(p.no_data)}</div>')
        figs.append(f"<figure><h3>{e(p.title)}</h3>{body}<figcaption>{e(p.caption)}</figcaption></figure>")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{_STYLE}</style></head><body>"
            f'<h1>{e(title)}</h1><p class="sub">{e(subtitle)}</p>'
            f'<div class="tables">{tables}</div>'
            f'<h2>Plots</h2><div class="plots">{"".join(figs)}</div>'
            f'<div id="render-check" hidden data-images="" data-loaded=""></div>'
            f"<script>{_CHECK}</script></body></html>\n")
