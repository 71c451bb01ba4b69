"""Aggregate demo runs: the table, `results.json`, `report.md` and plots (reward vs step and vs time)."""

from __future__ import annotations

import math
import platform
import statistics
from pathlib import Path

from humanline.experiments.harness.cost_score import CostPoint, cost_score_figure, regime_point
from humanline.experiments.harness.results import (
    Curve,
    by_regime,
    compared,
    curve_panels,
    pyplot,
    regimes_of,
    write_report,
    write_results,
)


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


COSTS = ("cpu_seconds", "train_seconds", "generation_seconds", "samples_generated", "generated_tokens",
         "forward_tokens", "backward_tokens")


def aggregate(results: dict) -> list[dict]:
    """One row per (objective, regime) in the order they ran: mean ± std over seeds, costs (means over seeds),
    the share of the offline -> online gap closed and the speed-up over online in CPU time."""
    rows = []
    for (objective, regime), runs in by_regime(results["runs"]).items():
        reward, reward_std = _mean_std([r["final_reward"] for r in runs])
        rows.append({
            "objective": objective, "regime": regime, "seeds": len(runs),
            "reward_mean": reward, "reward_std": reward_std,
            "per_seed": [r["final_reward"] for r in runs],
            **{key: _mean_std([r.get(key, float("nan")) for r in runs])[0] for key in COSTS},
            "inside_band": _mean_std([r["inside_band"] for r in runs if r.get("inside_band") is not None])[0],
        })
    for row in rows:
        _, offline, online = regimes_of(rows, row["objective"])
        row["speedup_vs_online"] = (online["cpu_seconds"] / row["cpu_seconds"]
                                    if online and row["cpu_seconds"] > 0 else None)
        # only where online beat offline: otherwise there is no gap to close, and the share would flip signs
        row["gap_closed"] = None
        row["online_beat_offline"] = (online["reward_mean"] > offline["reward_mean"]) if online and offline else None
        if row["online_beat_offline"]:
            row["gap_closed"] = ((row["reward_mean"] - offline["reward_mean"])
                                 / (online["reward_mean"] - offline["reward_mean"]))
    return rows


def _tokens(value: float) -> str:
    return "0" if not value else f"{value / 1000:.0f}k" if value >= 10_000 else f"{value:.0f}"


def gap_text(row: dict) -> str:
    """The gap-closed cell: a share where online beat offline, else why there is none."""
    if row["gap_closed"] is not None:
        return f"{100 * row['gap_closed']:.0f}%"
    return "n/a (online did not beat offline)" if row.get("online_beat_offline") is False else "—"


def table(rows: list[dict], base_reward: float) -> str:
    head = ("| objective | regime | held-out reward (mean ± std) | per seed | gap closed | inside band | CPU s "
            "| wall s | generated tokens | forward / backward tokens | CPU speed-up vs online |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = f"{r['speedup_vs_online']:.1f}x" if r["speedup_vs_online"] else "—"
        gap = gap_text(r)
        inside = (f"{r['inside_band']:.3f}" if isinstance(r["inside_band"], float) and math.isfinite(r["inside_band"])
                  else "—")
        seeds = " / ".join(f"{v:.3f}" for v in r["per_seed"])
        lines.append(f"| {r['objective']} | {r['regime']} | {r['reward_mean']:.3f} ± {r['reward_std']:.3f} | {seeds} "
                     f"| {gap} | {inside} | {r['cpu_seconds']:.1f} | {r['train_seconds']:.1f} "
                     f"| {_tokens(r['generated_tokens'])} | {_tokens(r['forward_tokens'])} / "
                     f"{_tokens(r['backward_tokens'])} | {speed} |")
    lines.append(f"\nBase policy before alignment: held-out reward {base_reward:.3f}. 'gap closed' = (regime - offline)"
                 " / (online - offline). Costs are means per run over the training steps (evaluation excluded): "
                 "CPU s = this process's CPU time (steady on a busy machine, unlike wall s), generated tokens = "
                 "completion tokens sampled, forward / backward tokens = sequence tokens through forwards (policy "
                 "and reference) and through the backward. 'inside band' = share of tokens inside the clip band.")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> list[str]:
    """Plain statements of what the numbers show, including when the paper's claim does not appear."""
    out = []
    for objective, by, off, on in compared(rows, sorted({r["objective"] for r in rows})):
        gap = on["reward_mean"] - off["reward_mean"]
        if gap <= 0.01:
            out.append(f"{objective}: online did not beat offline here ({on['reward_mean']:.3f} vs "
                       f"{off['reward_mean']:.3f}); the comparison says little about humanline at this scale.")
            continue
        for name, r in by.items():
            if "+" not in name:
                continue
            closed = (r["reward_mean"] - off["reward_mean"]) / gap
            # Online's own spread: a noisy regime does not "match" just because its own std is wide.
            if r["reward_mean"] >= on["reward_mean"] - on["reward_std"]:
                word = "matches online (within online's seed std)"
            elif closed > 0.1:
                word = f"closes {100 * closed:.0f}% of the offline-online gap"
            else:
                word = "does not improve on offline"
            speed = f", {r['speedup_vs_online']:.1f}x online's CPU speed" if r["speedup_vs_online"] else ""
            out.append(f"{objective}: {name} {word} ({r['reward_mean']:.3f} vs online {on['reward_mean']:.3f}, "
                       f"offline {off['reward_mean']:.3f}){speed}.")
    return out


def plot(results: dict, out: Path) -> list[Path]:
    """Per objective: held-out reward (mean ± std over seeds) against steps and CPU seconds; the ablation's bars."""
    paths = []
    groups = by_regime(results["runs"])
    for objective in dict.fromkeys(r["objective"] for r in results["runs"]):
        curves = [_curve(regime, runs, results["data"]["base_reward"]) for (o, regime), runs in groups.items()
                  if o == objective and runs[0]["curve"]]
        title = f"{objective}: held-out reward (mean ± std over seeds)"
        paths.append(curve_panels(curves, (11, 4), ("optimizer step", "training CPU time (s, generation included)"),
                                  "held-out reward", title, out / f"reward_{objective}.png"))
        settings = results["settings"]
        points = cost_points(aggregate(results), objective, results["data"], settings["steps"],
                             settings["sample_every"])
        cost = cost_score_figure(points, "held-out reward",
                                 f"{objective}: what each regime costs against its reward (± se over seeds)",
                                 out / f"cost_{objective}.png")
        paths += [cost] if cost else []
    if results["settings"].get("ablation"):
        paths.append(plot_ablation(aggregate(results), out))
    return paths


def cost_points(rows: list[dict], objective: str, data: dict, steps: int, sample_every: int) -> list[CostPoint]:
    """`objective`'s regimes as points of cost against reward: completion tokens sampled (offline: the offline data's,
    once) and sampling passes over `steps` steps (`sampling_passes`); mean reward ± its standard error over seeds
    (results of older demos hold no offline tokens: their offline points show on the passes panel only)."""
    return [regime_point(r["regime"], sampled_tokens=r["generated_tokens"], data_tokens=data.get("offline_tokens", 0),
                         steps=steps, sample_every=sample_every, score=r["reward_mean"],
                         se=r["reward_std"] * math.sqrt(r["seeds"] / max(r["seeds"] - 1, 1)) / math.sqrt(r["seeds"]))
            for r in rows if r["objective"] == objective]


def _curve(regime: str, runs: list[dict], base: float) -> Curve:
    """A regime's seed-mean reward (± std) from the base policy's on, at the evaluations every seed reached."""
    steps = [0] + [p["step"] for p in runs[0]["curve"]]
    rewards = [[base] + [p["reward"] for p in r["curve"]] for r in runs]
    clocks = [[0.0] + [p.get("cpu_seconds", p["train_seconds"]) for p in r["curve"]] for r in runs]
    n = min(len(x) for x in rewards)
    mean = [statistics.fmean(x[i] for x in rewards) for i in range(n)]
    std = [statistics.pstdev([x[i] for x in rewards]) if len(rewards) > 1 else 0.0 for i in range(n)]
    clock = [statistics.fmean(x[i] for x in clocks) for i in range(n)]
    return Curve(regime, steps[:n], clock, mean, std)


def plot_ablation(rows: list[dict], out: Path) -> Path:
    """One panel per objective: held-out reward of every regime (mean, error bar = std over seeds), with the
    offline and online means as dashed lines (the paper's Figure 5 in miniature)."""
    plt = pyplot()
    objectives = list(dict.fromkeys(r["objective"] for r in rows))
    fig, axes = plt.subplots(1, len(objectives), figsize=(5.2 * len(objectives), 4.6), squeeze=False)
    for ax, objective in zip(axes[0], objectives):
        mine = [r for r in rows if r["objective"] == objective]
        names = [r["regime"].removeprefix("offline+") for r in mine]
        means, stds = [r["reward_mean"] for r in mine], [r["reward_std"] for r in mine]
        ax.barh(range(len(mine)), means, xerr=stds, capsize=3,
                color=["0.6" if "+" not in r["regime"] else "C0" for r in mine])
        ax.set_xlim(max(0.0, min(m - s for m, s in zip(means, stds)) - 0.05),
                    max(m + s for m, s in zip(means, stds)) + 0.02)
        for name, style in (("offline", "C3"), ("online", "C2")):
            ref = next((r for r in mine if r["regime"] == name), None)
            if ref:
                ax.axvline(ref["reward_mean"], color=style, linestyle="--", linewidth=1, label=name)
        ax.set_yticks(range(len(mine)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("held-out reward (mean ± std over seeds)")
        ax.set_title(objective)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    fig.tight_layout()
    path = out / "ablation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(results: dict, out: Path, elapsed: float) -> str:
    rows = aggregate(results)
    results["summary"] = rows
    results["verdict"] = verdict(rows)
    results["machine"] = {"python": platform.python_version(), "processor": platform.processor() or platform.machine()}
    results["elapsed_seconds"] = round(elapsed, 1)
    write_results(results, out)
    plots = plot(results, out)
    intro = ("Same tiny base policy aligned on 2-digit addition (reward 1 for the exact answer). Offline data: "
             f"{_source_text(results['data'])}. "
             "Held-out reward = mean over held-out prompts of samples at temperature 1.")
    return write_report(out, "humanline demo", intro, table(rows, results["data"]["base_reward"]), results["verdict"],
                        plots, f"Total demo time: {elapsed:.0f} s. Settings: `results.json` → settings.")


def _source_text(data: dict) -> str:
    """Where the offline groups were sampled from, for the report (results of older demos hold no source)."""
    if data.get("offline_source", "weak") == "base":
        return ("groups sampled from the base policy itself before alignment "
                f"(held-out reward {data['base_reward']:.3f})")
    return f"groups sampled from a different, weaker policy (held-out reward {data['weak_reward']:.3f})"
