"""An HTML report of a dataset version: funnel, pass rates, speedups, compile errors, subsets.

One self-contained page: matplotlib figures are embedded as base64 PNG so the file can be mailed
or attached to a CI run as is.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on build machines
import matplotlib.pyplot as plt  # noqa: E402

from pipeline.datasets.stats import format_value, metric_definition  # noqa: E402
from pipeline.datasets.versions import read_stats, verify_version  # noqa: E402


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bar(title: str, labels: list[str], values: list[float], xlabel: str = "") -> str:
    fig, ax = plt.subplots(figsize=(7, max(1.8, 0.35 * len(labels) + 1)))
    ax.barh(labels[::-1], values[::-1], color="#4c72b0")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    for y, v in enumerate(values[::-1]):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=8)
    return _png(fig)


def _speedup_hist(speedup: dict[str, Any]) -> str | None:
    hist = speedup.get("histogram")
    if not hist:
        return None
    bins, counts = hist["bins_log2"], hist["counts"]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar([2 ** b for b in bins[:-1]], counts,
           width=[2 ** bins[i + 1] - 2 ** bins[i] for i in range(len(counts))], align="edge",
           color="#55a868", edgecolor="white")
    ax.set_xscale("log", base=2)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("speedup over eager (log2)")
    ax.set_ylabel("correct kernels")
    ax.set_title(f"speedups (n={speedup.get('n', 0)}, median {speedup.get('p50', 0):.2f}x)")
    return _png(fig)


def _table(rows: list[list[Any]], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(format_value(v))}</td>" for v in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_report(version_dir: Path) -> str:
    """The HTML page for a verified version."""
    manifest = verify_version(version_dir)
    stats = read_stats(version_dir)
    title = f"{manifest['name']} {manifest['version']}"
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>parent {html.escape(str(manifest.get('parent_version')))}, content hash "
             f"<code>{manifest['content_hash'][:16]}</code>, created "
             f"{html.escape(str(manifest.get('created_at')))}</p>"]
    counts = manifest["counts"]
    parts.append("<h2>Subsets</h2>" + _table(
        [[c, s.get("train", 0), s.get("validation", 0)] for c, s in counts.items()],
        ["config", "train", "validation"]))
    images: list[tuple[str, str]] = [("rows per subset", _bar(
        "rows per subset", list(counts), [float(sum(s.values())) for s in counts.values()]))]
    if stats:
        funnel = stats.get("funnel", {})
        images.append(("funnel", _bar("funnel", list(funnel), [float(v) for v in
                                                                funnel.values()])))
        parts.append("<h2>Funnel</h2>" + _table([[k, v] for k, v in funnel.items()],
                                                ["stage", "count"]))
        parts.append("<h2>Metrics</h2>" + _table(
            [[k, v, metric_definition(k)] for k, v in stats.get("metrics", {}).items()],
            ["metric", "value", "definition"]))
        parts.append("<h2>Speedup quantiles</h2>" + _table(
            [[k, v] for k, v in stats.get("speedup", {}).items() if k != "histogram"],
            ["quantile", "speedup"]))
        for key, label in (("by_level", "level"), ("by_op_family", "op family"),
                           ("by_source", "source"), ("by_generator", "generator")):
            sl = stats.get(key, {})
            if sl:
                images.append((f"pass rate by {label}", _bar(
                    f"pass rate by {label}", list(sl), [d["pass_rate"] for d in sl.values()],
                    "correct / verified")))
                parts.append(f"<h3>by {label}</h3>" + _table(
                    [[k, d["verified"], d["correct"], d["pass_rate"], d["faster"]]
                     for k, d in sl.items()],
                    [label, "verified", "correct", "pass rate", "faster"]))
        hist = _speedup_hist(stats.get("speedup", {}))
        if hist:
            images.append(("speedups", hist))
        errors = stats.get("compile_errors", {})
        if errors:
            images.append(("compile-error taxonomy", _bar(
                "compile-error taxonomy", list(errors), [float(v) for v in errors.values()])))
            parts.append("<h2>Compile-error taxonomy</h2>" + _table(
                [[k, v] for k, v in errors.items()], ["class", "count"]))
    else:
        parts.append("<p>This version has no stored statistics.</p>")
    parts.append("<h2>Plots</h2>")
    parts += [f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
              f"<figcaption>{html.escape(alt)}</figcaption></figure>" for alt, data in images]
    parts.append("<h2>Lineage</h2><pre>" + html.escape(json.dumps(manifest.get("lineage", {}),
                                                                  indent=2)) + "</pre>")
    style = ("body{font-family:sans-serif;max-width:960px;margin:2em auto}table{border-collapse:"
             "collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def write_report(version_dir: Path, out: Path | None = None) -> Path:
    """Write the report next to the version (outside it, so its hashes stay valid)."""
    version_dir = Path(version_dir)
    out = out or version_dir.parent / f"{version_dir.name}-report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(version_dir), encoding="utf-8")
    return out
