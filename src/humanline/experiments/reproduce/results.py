"""The reproduction's results: per regime pass@1 over seeds, comparisons paired by seed, where the
wall-clock went, how long each regime takes to reach online's final pass@1, a table, plots and a report.

Definitions (also printed under the table):
- pass@1: held-out, `eval_samples` samples per prompt at the run's temperature, at the last step; mean ± sample
  std over seeds. Paired Δ: the mean over seeds of (regime - other) for the same seed, ± its standard error.
- final models (with `--final-samples N`): each run's final model evaluated once more, N samples per held-out
  prompt, the same random draws for every run; the same statistics over seeds.
- seconds: wall-clock of one run on one thread: generation (sampling), reward (scoring) and training (reference,
  forward, backward, optimizer), without evaluation (timed apart). Offline regimes pay the one-off cost of the
  offline data once: it is added to their time to target (a user who trains one offline model pays it once).
- time to online's final: the first evaluation at which the regime's seed-mean pass@1 reaches the seed-mean
  final pass@1 of online, in seed-mean seconds of training (+ the offline data for offline regimes); `speed-up`
  is online's own time to that mark over the regime's.
"""

from __future__ import annotations

import math
import platform
import re
import statistics
from pathlib import Path

from humanline.experiments.harness.regimes import regime_overrides
from humanline.experiments.harness.results import (
    by_regime,
    compared,
    regimes_of,
    write_report,
    write_results,
)
from humanline.experiments.reproduce.data import made_by
from humanline.experiments.reproduce.declines import fallen_table
from humanline.experiments.reproduce.figures import figures
from humanline.experiments.reproduce.runs import MECHANISM
from humanline.training.run_info import code_commit

SECOND_KINDS = ("generation", "reward", "train", "eval")


def _stats(values: list[float]) -> dict:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return {"mean": float("nan"), "std": float("nan"), "se": float("nan"), "n": 0}
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "se": std / math.sqrt(len(values)), "n": len(values)}


def _last(run: dict) -> float:
    return run["final_pass@1"]


def _final_model(run: dict) -> float:
    return run["final_eval"]["pass@1"]


def _paired(runs: list[dict], others: list[dict], value=_last) -> dict | None:
    """Mean and standard error over seeds of this regime's pass@1 (`value` of a run) minus another's, same seed."""
    theirs = {r["seed"]: value(r) for r in others}
    diffs = [value(r) - theirs[r["seed"]] for r in runs if r["seed"] in theirs]
    return _stats(diffs) if diffs else None


def gap_closed(value: float, offline: float, online: float) -> float | None:
    """The share of the offline-to-online gap that `value` closes; None unless online is above offline (there is
    no gap to close otherwise: the figure would only flip signs)."""
    return (value - offline) / (online - offline) if online > offline else None


def _measured(*rows: dict) -> bool:
    """Whether every run of `rows` has a final-model evaluation."""
    return all("final_eval" in r for row in rows for r in row["runs"])


def _final_models(row: dict, offline: dict | None, online: dict | None) -> dict | None:
    """The final-model evaluation's statistics of a row, when every run of it (and of offline and online) has one."""
    if not _measured(row):
        return None
    out = {"samples": row["runs"][0]["final_eval"]["samples"],
           "pass@1": _stats([_final_model(r) for r in row["runs"]]),
           "per_seed": {r["seed"]: _final_model(r) for r in row["runs"]},
           "eval_se": _stats([r["final_eval"]["stderr"] for r in row["runs"]])["mean"],
           "vs_offline": None, "vs_online": None, "gap_closed": None, "compared": False}
    for name, other in (("offline", offline), ("online", online)):
        if other is not None and other is not row and _measured(other):
            out[f"vs_{name}"] = _paired(row["runs"], other["runs"], _final_model)
    if offline is not None and online is not None and _measured(offline, online):
        low, high = (_stats([_final_model(r) for r in o["runs"]])["mean"] for o in (offline, online))
        out["gap_closed"], out["compared"] = gap_closed(out["pass@1"]["mean"], low, high), True
    return out


def mean_curve(runs: list[dict]) -> list[dict]:
    """Seed-mean curve: pass@1 and seconds at each evaluation index that every run has."""
    n = min(len(r["curve"]) for r in runs)
    return [{"step": runs[0]["curve"][i]["step"],
             "pass@1": statistics.fmean(r["curve"][i]["pass@1"] for r in runs),
             "seconds": statistics.fmean(r["curve"][i]["seconds"] for r in runs)} for i in range(n)]


def time_to(curve: list[dict], target: float, offset: float) -> float | None:
    """Seconds (+ `offset`) of the first evaluation whose pass@1 reaches `target`; None if none does."""
    return next((p["seconds"] + offset for p in curve if p["pass@1"] >= target - 1e-12), None)


def aggregate(results: dict) -> list[dict]:
    """One row per (objective, regime), in the order they ran."""
    data_cost = (results["data"]["offline"] or {}).get("seconds", 0.0)
    rows = []
    for (objective, regime), runs in by_regime(results["runs"]).items():
        offline = regime_overrides(regime)["train"]["regime"] == "offline"
        rows.append({
            "objective": objective, "regime": regime, "runs": runs, "pass@1": _stats([r["final_pass@1"] for r in runs]),
            "per_seed": {r["seed"]: r["final_pass@1"] for r in runs},
            "eval_se": _stats([r["final_stderr"] for r in runs if r.get("final_stderr") is not None])["mean"],
            "seconds": {k: _stats([r["seconds"][k] for r in runs])["mean"] for k in SECOND_KINDS + ("step",)},
            "data_seconds": data_cost if offline else 0.0,
            "curve": mean_curve(runs),
            "inside_band": _stats([r["humanline"].get("humanline/inside_band") for r in runs])["mean"],
            "steps_since_sync": _stats([r["humanline"].get("humanline/steps_since_sync") for r in runs])["mean"],
            **{name: _stats([r.get(name) for r in runs])["mean"] for name in MECHANISM},
        })
    for row in rows:
        _, offline, online = regimes_of(rows, row["objective"])
        row["vs_offline"] = _paired(row["runs"], offline["runs"]) if offline and offline is not row else None
        row["vs_online"] = _paired(row["runs"], online["runs"]) if online and online is not row else None
        row["final_models"] = _final_models(row, offline, online)
        row["gap_closed"] = (gap_closed(row["pass@1"]["mean"], offline["pass@1"]["mean"], online["pass@1"]["mean"])
                             if online and offline else None)
        row["time_to_online"] = row["speedup"] = None
        row["has_online"], row["has_offline"] = online is not None, offline is not None
        if online:
            target = online["pass@1"]["mean"]
            row["time_to_online"] = time_to(row["curve"], target, row["data_seconds"])
            own = time_to(online["curve"], target, 0.0)
            if row["time_to_online"] and own:
                row["speedup"] = own / row["time_to_online"]
        step = row["seconds"]["step"]
        row["sampling_share"] = ((row["seconds"]["generation"] + row["seconds"]["reward"]) / step) if step else None
    return rows


def _num(value, fmt: str = ".3f", none: str = "—") -> str:
    return none if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def _gap(gap: float | None, compared: bool) -> str:
    """The gap-closed cell: a share, "n/a" where offline and online ran but online did not beat offline (no gap
    to close), "—" where one of them did not run."""
    if gap is not None:
        return f"{100 * gap:.0f}%"
    return "n/a" if compared else "—"


def _delta(d: dict | None) -> str:
    return "—" if d is None else f"{d['mean']:+.3f} ± {d['se']:.3f}"


def table(rows: list[dict], data: dict) -> str:
    lines = ["| objective | regime | pass@1 (mean ± std) | per seed | Δ vs offline | Δ vs online | gap closed "
             "| generation s | training s | eval s | time to online's final | speed-up | inside band | PPO clip "
             "| clip A>0 / A<0 | steps since sync | mean abs log-ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["pass@1"]
        seeds = " / ".join(f"{v:.3f}" for v in r["per_seed"].values())
        gen = r["seconds"]["generation"] + r["seconds"]["reward"]
        to = _num(r["time_to_online"], ".0f", "not reached" if r["has_online"] else "—")
        if r["data_seconds"] and r["time_to_online"] is not None:
            to += f" (data {r['data_seconds']:.0f})"
        lines.append(f"| {r['objective']} | {r['regime']} | {p['mean']:.3f} ± {p['std']:.3f} | {seeds} "
                     f"| {_delta(r['vs_offline'])} | {_delta(r['vs_online'])} "
                     f"| {_gap(r['gap_closed'], r['has_online'] and r['has_offline'])} "
                     f"| {gen:.0f} | {r['seconds']['train']:.0f} | {r['seconds']['eval']:.0f} | {to} "
                     f"| {_num(r['speedup'], '.2f')}{'x' if r['speedup'] else ''} | {_num(r['inside_band'])} "
                     f"| {_num(r['ppo_clip_fraction'])} | {_num(r['ppo_clip_pos'])} / {_num(r['ppo_clip_neg'])} "
                     f"| {_num(r['steps_since_sync'], '.1f')} | {_num(r['drift'])} |")
    lines += final_table(rows, data)
    lines += preference_table(rows)
    lines += stale_table(rows)
    lines += comparison_table(rows)
    lines += fallen_table(rows)
    base, offline, quality = data["base"], data["offline"], data["base"].get("quality")
    described = "No offline data (no offline regime ran). "
    if offline is not None:
        temperature = offline.get("temperature", 1.0)  # data made before the key existed: T = 1
        source = offline.get("source", "base")  # data made before sources existed: the base policy's
        made = ("sampled once " if source == "base" else "") + made_by(source, temperature)
        described = (f"Offline data: {offline['groups_kept']} groups of {offline['samples_per_prompt']} (of "
                     f"{offline['groups']} {made}; the others scored "
                     f"alike), {offline['seconds']:.0f} s on one thread; its mean token log-prob under the base "
                     f"{quality['mean']:.3f} (quartiles {quality['q25']:.3f} / {quality['q50']:.3f} / "
                     f"{quality['q75']:.3f}; the paper's worst quartile of data lay in [-1.03, -0.36]). ")
    task = data.get("task", "sums")
    lines.append(f"\nTask: {task}. Base policy: held-out pass@1 {base['pass@1']:.3f} ± "
                 f"{base['pass@1_stderr']:.3f}. {described}"
                 f"Seconds are per run on one thread (means over "
                 f"seeds); 'generation s' includes scoring. Evaluation standard error over prompts: "
                 f"{_mean_stderr(rows)}.")
    return "\n".join(lines)


def _mean_stderr(rows: list[dict]) -> str:
    """The mean evaluation standard error of the rows that have one (0 is one: every answer alike)."""
    known = [r["eval_se"] for r in rows if r["eval_se"] is not None and math.isfinite(r["eval_se"])]
    return f"~{statistics.fmean(known):.3f}" if known else "not measured"


def final_table(rows: list[dict], data: dict) -> list[str]:
    """The final-model evaluation's table (rows whose runs all have one), else nothing."""
    rows = [r for r in rows if r["final_models"]]
    if not rows:
        return []
    base = data.get("base_final")
    base = f"; the base policy {base['pass@1']:.3f} ± {base['stderr']:.3f} (se)" if base else ""
    lines = [f"\nFinal models, {rows[0]['final_models']['samples']} samples per held-out prompt (the same draws for "
             f"every run; evaluation standard error over prompts ~"
             f"{statistics.fmean(r['final_models']['eval_se'] for r in rows):.3f}{base}):\n",
             "| objective | regime | pass@1 (mean ± std) | per seed | Δ vs offline | Δ vs online | gap closed |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["final_models"]
        seeds = " / ".join(f"{v:.3f}" for v in f["per_seed"].values())
        gap = _gap(f["gap_closed"], f["compared"])
        lines.append(f"| {r['objective']} | {r['regime']} | {f['pass@1']['mean']:.3f} ± {f['pass@1']['std']:.3f} "
                     f"| {seeds} | {_delta(f['vs_offline'])} | {_delta(f['vs_online'])} | {gap} |")
    return lines


def preference_table(rows: list[dict]) -> list[str]:
    """DPO and KTO rows: the seed-mean curve's best evaluation against its last (a peak and a decline show), and
    what the reference did to the loss: DPO's mean pair weight sigmoid(-beta margin) (1/2 where the reference is
    the pre-update policy), KTO's reference point z0, the drift (mean |token log-ratio| to the reference) and the
    share of tokens outside humanline's band. Nothing unless such a row ran."""
    rows = [r for r in rows if r["objective"] in ("dpo", "kto", "ipo") and r["curve"]]
    if not rows:
        return []
    lines = ["\nDPO / KTO along the run (seed-mean curve; run means of the per-step metrics):\n",
             "| objective | regime | last eval | best eval (step) | pair weight | z0 | drift | outside band |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = max(r["curve"], key=lambda p: p["pass@1"])
        outside = None if r["inside_band"] is None or not math.isfinite(r["inside_band"]) else 1 - r["inside_band"]
        lines.append(f"| {r['objective']} | {r['regime']} | {r['curve'][-1]['pass@1']:.3f} "
                     f"| {best['pass@1']:.3f} ({best['step']}) | {_num(r['pair_weight'])} | {_num(r['kl_ref'])} "
                     f"| {_num(r['drift'])} | {_num(outside)} |")
    return lines


def stale_table(rows: list[dict]) -> list[str]:
    """What stale samples and their corrections did, for the rows that sampled (online, sparse, stale): the
    batches' mean age in versions, the shares of tokens a correction masked or capped, the effective sample size
    of its weights, and the tokens generated per run; nothing unless a stale regime ran."""
    kinds = {r["regime"]: regime_overrides(r["regime"])["train"]["regime"] for r in rows}
    if "stale" not in kinds.values():
        return []
    lines = ["\nStale samples (run means; masked / capped / ESS: the correction's token shares and effective sample "
             "size, — without one):\n",
             "| objective | regime | staleness | masked | capped | ESS | tokens generated |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if kinds[r["regime"]] == "offline":
            continue
        tokens = _stats([run.get("generated_tokens") for run in r["runs"]])["mean"]
        lines.append(f"| {r['objective']} | {r['regime']} | {_num(r['staleness'], '.1f')} | {_num(r['masked'])} "
                     f"| {_num(r['capped'])} | {_num(r['ess'])} | {_num(tokens, '.0f')} |")
    return lines


def comparisons(rows: list[dict]) -> list[tuple[dict, dict]]:
    """The pairs a set of regimes invites beyond offline and online (same objective): every row against each
    `rounds<N>` row (the paper's online), each variant of a sparse or stale regime against the plain one with the
    same period or staleness, and the drift rule (`-kauto`) against every fixed k of the same data regime and
    variant. Pairs `(row, other)`, in the rows' order."""
    by = {(r["objective"], r["regime"]): r for r in rows}
    pairs = []
    for r in rows:
        data, _, variant = r["regime"].partition("+")
        # the paper's online in rounds is a second online baseline: every other row against it
        pairs += [(r, o) for o in rows if o["objective"] == r["objective"] and o is not r
                  and o["regime"].startswith("rounds") and not r["regime"].startswith("rounds")]
        plain = by.get((r["objective"], data))
        if variant and data.startswith(("sparse", "stale")) and plain is not None:
            pairs.append((r, plain))
        if "-kauto" in variant:
            stem = variant.split("-kauto")[0]
            pairs += [(r, o) for o in rows if o["objective"] == r["objective"]
                      and re.fullmatch(rf"{re.escape(data)}\+{re.escape(stem)}-k\d+", o["regime"])]
    return pairs


def comparison_table(rows: list[dict]) -> list[str]:
    """`comparisons` as a table: paired by seed, on the final models where every run of both has one."""
    pairs = comparisons(rows)
    if not pairs:
        return []
    lines = ["\nPaired by seed (mean ± standard error of the per-seed difference; final models where measured):\n",
             "| objective | regime | vs | Δ pass@1 | seeds | in standard errors |", "|---|---|---|---|---|---|"]
    for row, other in pairs:
        final = _measured(row, other)
        d = _paired(row["runs"], other["runs"], _final_model if final else _last)
        if d is None:
            continue
        z = d["mean"] / d["se"] if d["se"] else math.inf if d["mean"] else 0.0
        lines.append(f"| {row['objective']} | {row['regime']} | {other['regime']} | {_delta(d)} | {d['n']} "
                     f"| {z:+.1f} |")
    return lines


def verdict(rows: list[dict]) -> list[str]:
    """Plain statements of what the numbers show, the paper's claim not appearing included."""
    out = []
    for objective, by, off, on in compared(rows, dict.fromkeys(r["objective"] for r in rows)):
        gap = on["pass@1"]["mean"] - off["pass@1"]["mean"]
        share = on["sampling_share"]
        out.append(f"{objective}: online {on['pass@1']['mean']:.3f} ± {on['pass@1']['std']:.3f} vs offline "
                   f"{off['pass@1']['mean']:.3f} ± {off['pass@1']['std']:.3f}; sampling and scoring are "
                   f"{100 * share:.0f}% of online's step time" + ("" if gap > 0.01 else
                   " — online did not beat offline here, so the comparison says little about humanline"))
        for name, r in by.items():
            if name in ("offline", "online"):
                continue
            words = _standing(r, on)
            if r["speedup"]:
                words.append(f"reaches online's final pass@1 {r['speedup']:.2f}x sooner than online")
            elif r["time_to_online"] is None:
                words.append("never reaches online's final pass@1")
            out.append(f"{objective}: {name} {r['pass@1']['mean']:.3f}: " + "; ".join(words) + ".")
            if r["final_models"] and on["final_models"]:
                f = r["final_models"]
                out.append(f"{objective}: {name}, final models at {f['samples']} samples per prompt, "
                           f"{f['pass@1']['mean']:.3f}: " + "; ".join(_standing(f, on["final_models"])) + ".")
    return out


def _standing(r: dict, online: dict) -> list[str]:
    """Within one std of online? Above offline by more than 2 paired standard errors? (`r`: a row or its
    `final_models`, `online` the same of online.)"""
    within = r["pass@1"]["mean"] >= online["pass@1"]["mean"] - online["pass@1"]["std"]
    above = r["vs_offline"] and r["vs_offline"]["se"] > 0 and r["vs_offline"]["mean"] > 2 * r["vs_offline"]["se"]
    return ["within one std of online" if within else "below online by more than its std",
            "above offline by more than 2 paired standard errors" if above else
            "not above offline by 2 paired standard errors"]


def machine() -> dict:
    """What the seconds were measured on (every figure names its machine)."""
    import os

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "load_1m": os.getloadavg()[0],
            "python": platform.python_version(), "torch": torch.__version__, "code": code_commit()}


def write_outputs(results: dict, out: Path, elapsed: float) -> str:
    rows = aggregate(results)
    summary = [{k: v for k, v in r.items() if k != "runs"} for r in rows]
    results.update(summary=summary, verdict=verdict(rows), elapsed_seconds=round(elapsed, 1), machine=machine())
    write_results(results, out, end="\n")
    text = table(rows, results["data"])
    plots = figures(rows, results["data"]["base"]["pass@1"], out, results["data"], results["settings"]["sample_every"])
    m = results["machine"]
    closing = (f"Machine: {m['cpu']}, {m['cores']} cores usable, load average {m['load_1m']:.1f} at the end; "
               f"torch {m['torch']}; code {m['code'] or 'not a git checkout'}. Total time of this invocation: "
               f"{elapsed:.0f} s. Settings: `results.json` → "
               f"settings.")
    return write_report(out, "humanline reproduce smollm2", __doc__.split("\n\n", 1)[1].strip(), text,
                        results["verdict"], plots, closing)
