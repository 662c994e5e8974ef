"""``inspect --plot``: rows and steps per rank, Petastorm's sharding beside the balanced plan, as one PNG.

matplotlib is imported here only (the ``plot`` extra), with the Agg backend so it works on headless nodes.
"""
from __future__ import annotations

import os
import textwrap

import numpy as np

from ..errors import InvalidValueError

FIGSIZE = (12.0, 5.0)  # inches
DPI = 100  # so the PNG is 1200 x 500 pixels
PETASTORM_COLOR, BALANCED_COLOR = "#d62728", "#1f77b4"


def plot_report(report: dict, path: str) -> str:
    """Draw ``report`` (``report.inspect_report``) to ``path`` and return the path."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidValueError("--plot needs matplotlib: pip install 'petastorm-balanced[plot]'") from None
    ranks = np.arange(report["world_size"])
    theirs, ours = report["petastorm"]["ranks"], report["ranks"]
    fig, axes = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI)
    try:
        for ax, field, label in ((axes[0], "rows", "rows per rank"),
                                 (axes[1], "steps", f"steps per rank (batch_size {report['batch_size']})")):
            _bars(ax, ranks, [r[field] for r in theirs], [r[field] for r in ours], label)
        fig.suptitle(_title(report), fontsize=12, y=0.985)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=10, frameon=False, bbox_to_anchor=(0.5, 0.9))
        fig.subplots_adjust(left=0.065, right=0.985, bottom=0.1, top=0.73, wspace=0.18)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=DPI, format="png")
    finally:
        plt.close(fig)
    return path


def _bars(ax, ranks, theirs, ours, label) -> None:
    width = 0.4
    ax.bar(ranks - width / 2, theirs, width, color=PETASTORM_COLOR, label="Petastorm cur_shard/shard_count")
    ax.bar(ranks + width / 2, ours, width, color=BALANCED_COLOR, label="petastorm-balanced")
    spread = f"Petastorm {min(theirs)}..{max(theirs)}, balanced {min(ours)}..{max(ours)}" if len(ours) else ""
    ax.set_title(f"{label}\n{spread}", fontsize=10)
    ax.set_xlabel("rank")
    ax.set_ylabel(label.split(" per ")[0])
    step = max(1, int(np.ceil(len(ranks) / 16)))  # at most ~16 tick labels, so they never overlap
    ax.set_xticks(ranks[::step])
    top = max(max(theirs, default=0), max(ours, default=0))
    ax.set_ylim(0, top * 1.05 if top else 1)
    ax.axhline(ours[0] if len(ours) else 0, color=BALANCED_COLOR, linewidth=0.8, linestyle="--")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _title(report: dict) -> str:
    """Two lines: what and how many, then the predicate (shortened to fit the figure)."""
    pred = report["predicate"]
    what = "no predicate" if pred["kind"] == "none" else f"{pred['kind']} predicate: {pred['text']}"
    dataset = report["dataset_url"].rstrip("/").rsplit("/", 2)
    name = "/".join(dataset[-2:]) if len(dataset) > 1 else dataset[0]
    first = (f"{name}: {report['world_size']} ranks, epoch {report['epoch']}, policy {report['policy']}, "
             f"{report['matching_rows']} matching rows")
    if report["petastorm"].get("refused"):
        first += " (Petastorm itself refuses: fewer row groups than ranks)"
    return "\n".join(textwrap.shorten(line, 130, placeholder=" ...") for line in (first, what))
