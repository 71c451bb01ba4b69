"""The report of a run: training-curve plots and a markdown summary from its metrics.jsonl (`humanline report`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from humanline.errors import UserError
from humanline.evaluation.collapse import collapse_reasons

# (metric key, panel title); a panel is drawn when the run logged that key.
PANELS = [
    ("loss", "training loss"),
    ("eval/loss", "held-out loss (vs initial policy)"),
    ("reward", "reward of trained samples"),
    ("sample_reward", "reward of fresh samples"),
    ("eval/reward_mean", "held-out reward"),
    ("rewards/accuracy", "reward accuracy"),
    ("rewards/margin", "reward margin"),
    ("kl", "KL to reference"),
    ("log_ratio/mean", "mean token log-ratio"),
    ("humanline/inside_band", "inside-band fraction"),
    ("humanline/syncs", "reference syncs"),
    ("grad_norm", "gradient norm"),
]


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir}: no metrics.jsonl (is this a humanline run directory?)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from exc
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict) or not _is_number(row.get("step")):
            raise UserError(f"{path}:{number}: expected a JSON object with a 'step' number")
        rows.append(row)
    return rows


def _is_number(value) -> bool:
    """A plotted value: int or float, not bool. Non-finite values are logged as null (see training.metrics_log)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(row: dict, key: str) -> int:
    value = row.get(key)
    return int(value) if _is_number(value) else 0


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if _is_number(r.get(key))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_run(rows: list[dict], out: Path, title: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in PANELS if series(rows, k)[0]]
    if not panels:
        return None
    cols = 3
    n_rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, 3.0 * n_rows), squeeze=False)
    for ax, (key, name) in zip(axes.flat, panels):
        xs, ys = series(rows, key)
        ax.plot(xs, ys, marker="." if len(xs) < 30 else None)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summarize(rows: list[dict], run_dir: Path, plot: Path | None) -> str:
    trained = [r for r in rows if "loss" in r]
    last = trained[-1] if trained else {}
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    lines = [f"# Run report: {run_dir}", ""]
    config = run_dir / "config.yaml"
    if config.exists():
        import yaml

        cfg = yaml.safe_load(config.read_text()) or {}
        o, h, t = cfg.get("objective", {}), cfg.get("humanline", {}), cfg.get("train", {})
        band = f"clip [{h.get('low')}, {h.get('high')}]" if h.get("transform") == "clip" else h.get("transform")
        hl = f"on (k = {h.get('sync_every')}, {band})" if h.get("enabled") else "off"
        lines += [f"- objective: {o.get('name')}, regime: {t.get('regime')}, humanline: {hl}",
                  f"- model: {cfg.get('model', {}).get('name')}", ""]
    steps = [r for r in rows if "time/step" in r]  # every step logs its time, trained or not
    counts = steps[-1] if steps else last
    elapsed = rows[-1].get("elapsed_s")
    dropped = max((_count(r, "stale_steps") for r in steps), default=0)  # logged only when one is dropped
    lines += [f"- steps: {len(steps)}; trained on nothing: {_count(counts, 'skipped_steps')} (every group dropped: "
              f"{_count(counts, 'empty_steps')}; samples past objective.max_staleness: {dropped}; non-finite: "
              f"{_count(counts, 'skipped_steps') - _count(counts, 'empty_steps') - dropped})",
              f"- wall-clock: {elapsed if _is_number(elapsed) else 0:.1f} s; samples generated: "
              f"{_count(counts, 'samples_generated')}; reference syncs: {_syncs(rows)}", ""]
    reasons = collapse_reasons(rows, _end(run_dir, steps))
    if reasons:
        lines += [f"- **collapsed** (the policy stopped learning; `humanline train` exit code 5): {'; '.join(reasons)}",
                  ""]
    lines += ["| metric | first | last |", "|---|---|---|"]
    for key, _ in PANELS:
        _, ys = series(rows, key)
        if ys:
            lines.append(f"| {key} | {ys[0]:.4g} | {ys[-1]:.4g} |")
    if evals:
        lines += ["", "Last evaluation: " + ", ".join(f"{k} = {v:.4g}" for k, v in evals[-1].items()
                                                     if k.startswith("eval/") and _is_number(v))]
    lines += eval_lines(run_dir / "eval.json")
    if plot is not None:
        lines += ["", f"![training curves]({plot.name})"]
    return "\n".join(lines) + "\n"


def _end(run_dir: Path, steps: list[dict]) -> dict | None:
    """What the run's end recorded in run_info.json (`humanline.training.collapse_watch`), when it is the end of the
    steps logged (None: not recorded, or a later segment has not ended)."""
    try:
        end = json.loads((run_dir / "run_info.json").read_text()).get("end")
    except (OSError, ValueError, AttributeError):
        return None
    last = steps[-1].get("step") if steps else None
    return end if isinstance(end, dict) and end.get("step") == last else None


def _syncs(rows: list[dict]) -> int:
    """The run's reference syncs: the last `humanline/syncs` it logged (a running count; 0 with humanline off)."""
    _, counts = series(rows, "humanline/syncs")
    return int(counts[-1]) if counts else 0


def eval_lines(path: Path) -> list[str]:
    """The numbers of the `humanline eval` result beside the run (`eval.json`), as report lines; none without one.
    An unreadable file is named rather than skipped silently."""
    if not path.is_file():
        return []
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return ["", f"{path.name}: unreadable ({type(exc).__name__}), not reported"]
    lines = ["", f"## Evaluation ({path.name}: `humanline eval`)", "",
             f"- model: {result.get('model')}; prompts: {result.get('prompts')} ({result.get('num_prompts')} x "
             f"{result.get('n')} samples); reward: {result.get('reward_spec')}"]
    reward = result.get("reward") or {}
    if _is_number(reward.get("mean")):
        lines.append(f"- reward: {reward['mean']:.4g} ± {reward.get('std') or 0:.4g} (std over samples; "
                     f"{reward.get('num_failed', 0)} failed)")
    passes = {k: v for k, v in result.items() if k.startswith("pass@") and _is_number(v) and "stderr" not in k}
    if passes:
        stderr = result.get("pass@1_stderr")
        lines.append("- " + ", ".join(f"{k} = {v:.4g}" + (f" ± {stderr:.2g} (s.e.)" if k == "pass@1" and
                                                          _is_number(stderr) else "") for k, v in passes.items()))
    win = result.get("win_rate") or {}
    if _is_number(win.get("rate")):
        lines.append(f"- win rate vs {result.get('baseline')}: {win['rate']:.3f} (95% CI {win['ci95_low']:.3f}-"
                     f"{win['ci95_high']:.3f})")
    tokens = ((result.get("length") or {}).get("tokens") or {}).get("mean")
    if _is_number(tokens):
        lines.append(f"- mean completion length: {tokens:.1f} tokens")
    return lines


OUTPUTS = ("report.md", "curves.png")  # what `report` writes into the run folder


def report(run_dir: str | Path, overwrite: bool = False) -> Path:
    """Write `RUN_DIR/curves.png` and `RUN_DIR/report.md`; return the markdown path. An earlier report (perhaps
    edited by hand) is replaced only with `overwrite`; both are checked, with the folder's writability, before any
    work."""
    run = Path(run_dir)
    rows = read_metrics(run)
    if not rows:
        raise UserError(f"{run}/metrics.jsonl: empty (the run logged no step)")
    earlier = [name for name in OUTPUTS if (run / name).exists()]
    if earlier and not overwrite:
        raise UserError(f"report: {run / earlier[0]} exists (an earlier report, perhaps edited): pass --overwrite to "
                        f"replace {' and '.join(earlier)}, or copy it away first")
    if not os.access(run, os.W_OK | os.X_OK) or any(not os.access(run / name, os.W_OK) for name in earlier):
        raise UserError(f"report: cannot write into {run} (not writable); report.md and curves.png go there")
    try:
        plot = plot_run(rows, run / "curves.png", str(run))
        path = run / "report.md"
        path.write_text(summarize(rows, run, plot))
    except OSError as exc:
        raise UserError(f"report: cannot write into {run} ({exc.strerror or exc})") from exc
    return path
