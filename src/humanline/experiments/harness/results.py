"""An experiment's results: runs grouped by regime, the baselines of a row, the figures' panels, and the files
written (`results.json`, `report.md`, one curve figure per objective).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator


def by_regime(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The runs of each (objective, regime), in the order they ran."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["objective"], run["regime"]), []).append(run)
    return groups


def regimes_of(rows: list[dict], objective: str) -> tuple[dict, dict | None, dict | None]:
    """`objective`'s rows by regime, and its offline and online rows (None where that regime did not run)."""
    by = {r["regime"]: r for r in rows if r["objective"] == objective}
    return by, by.get("offline"), by.get("online")


def compared(rows: list[dict], objectives: Iterable[str]) -> Iterator[tuple[str, dict, dict, dict]]:
    """`(objective, its rows by regime, offline row, online row)` of each of `objectives` that ran both."""
    for objective in objectives:
        by, offline, online = regimes_of(rows, objective)
        if offline and online:
            yield objective, by, offline, online


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display); imported here, on first use: heavy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_panels(fig: Any, axes: Any, ylabel: str, title: str, path: Path) -> Path:
    """Label and grid every panel, a legend in the last, the title; write the figure to `path` and close it."""
    for ax in axes:
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


@dataclass
class Curve:
    """One regime's held-out measure at each evaluation, against optimizer steps and against seconds; `std`,
    when given, is drawn as a band around it."""

    label: str
    steps: list
    seconds: list
    values: list
    std: list | None = None


def curve_panels(curves: list[Curve], size: tuple[float, float], xlabels: tuple[str, str], ylabel: str, title: str,
                 path: Path) -> Path:
    """Two panels, the curves against steps (left) and against seconds (right); written to `path`."""
    fig, axes = pyplot().subplots(1, 2, figsize=size)
    for c in curves:
        for ax, xs in ((axes[0], c.steps), (axes[1], c.seconds)):
            line, = ax.plot(xs, c.values, marker="o", label=c.label)
            if c.std is not None:
                ax.fill_between(xs, [m - s for m, s in zip(c.values, c.std)], [m + s for m, s in zip(c.values, c.std)],
                                color=line.get_color(), alpha=0.15)
    axes[0].set_xlabel(xlabels[0])
    axes[1].set_xlabel(xlabels[1])
    return save_panels(fig, axes, ylabel, title, path)


def write_results(results: dict, out: Path, end: str = "") -> None:
    """`results.json` (non-finite numbers as floats), followed by `end`."""
    (out / "results.json").write_text(json.dumps(results, indent=2, default=float) + end)


def write_report(out: Path, title: str, intro: str, text: str, verdict: list[str], plots: list[Path],
                 closing: str) -> str:
    """`report.md`: the title, what was run (`intro`), the table (`text`), what it shows, the plots and a closing
    line. Returns what the command prints: the table and the verdict."""
    report = [f"# {title}", "", intro, "", text, "", "## What this shows", ""] + [f"- {v}" for v in verdict] + [""]
    report += [f"![{p.stem}]({p.name})" for p in plots]
    report += ["", closing]
    (out / "report.md").write_text("\n".join(report) + "\n")
    return text + "\n\n" + "\n".join(verdict)
