"""The cost-against-score figure (`harness.cost_score`) and the reproduction's points for it: offline regimes pay
the offline data's tokens once, sampled ones what they sampled; no two labels overlap, even for points that sit on
top of each other."""

from __future__ import annotations

import runpy
import sys

import pytest
from matplotlib.text import Text

from helpers_train import ROOT
from humanline.experiments.harness import cost_score
from humanline.experiments.harness.cost_score import CostPoint, cost_score_figure
from humanline.experiments.reproduce.figures import cost_points


def _row(regime: str, tokens: list[int], finals: list[float], data_seconds: float = 0.0) -> dict:
    runs = [{"seed": s, "generated_tokens": t, "steps": 32, "final_eval": {"pass@1": f}} for s, (t, f) in
            enumerate(zip(tokens, finals))]
    return {"regime": regime, "runs": runs, "data_seconds": data_seconds, "seconds": {"step": 100.0},
            "pass@1": {"mean": 0.0, "se": 0.0},
            "final_models": {"pass@1": {"mean": sum(finals) / len(finals), "se": 0.01}}}


def test_offline_regimes_cost_the_offline_data_and_sampled_ones_what_they_sampled():
    rows = [_row("offline", [0, 0], [0.2, 0.3], data_seconds=700.0), _row("offline+humanline", [0, 0], [0.3, 0.4],
                                                                          data_seconds=700.0),
            _row("online", [20_000, 22_000], [0.6, 0.7]), _row("sparse8+humanline", [3_000, 2_000], [0.5, 0.5])]
    points, label = cost_points(rows, {"offline": {"generated_tokens": 40_561}})
    by = {p.label: p for p in points}
    assert by["offline"].tokens == by["offline+humanline"].tokens == 40_561
    assert by["online"].tokens == 21_000 and by["sparse8+humanline"].tokens == 2_500
    assert by["offline"].passes == 1 and by["online"].passes == 32 and by["sparse8+humanline"].passes == 4
    assert by["online"].score == pytest.approx(0.65) and "final models" in label


def test_no_two_labels_overlap(tmp_path, monkeypatch):
    """Six regimes, four of them at one cost and nearly one score: every label's box clears every other."""
    boxes = []
    real = cost_score._labels

    def spy(ax, points):
        real(ax, points)
        ax.figure.canvas.draw()
        renderer = ax.figure.canvas.get_renderer()
        boxes.append([Text.get_window_extent(t, renderer) for t in ax.texts])  # the text, not its leader line

    monkeypatch.setattr(cost_score, "_labels", spy)
    points = [CostPoint(name, 40_000, 1, 0.30 + 0.001 * i, 0.02) for i, name in
              enumerate(["offline", "offline+humanline", "offline+nll0.1", "offline+humanline-nll0.1"])]
    points += [CostPoint("online", 25_000, 32, 0.6, 0.05), CostPoint("sparse8+humanline", 3_000, 4, 0.31, 0.04)]
    path = cost_score_figure(points, "pass@1", "test", tmp_path / "cost.png")
    assert path is not None and path.stat().st_size > 0
    assert len(boxes) == 2 and all(len(panel) == 6 for panel in boxes)
    for panel in boxes:
        for i, a in enumerate(panel):
            for b in panel[i + 1:]:
                assert not a.overlaps(b), (a, b)


def test_nothing_to_draw_on_a_log_axis_draws_nothing(tmp_path):
    assert cost_score_figure([CostPoint("offline", 0, 0, 0.3, 0.0)], "pass@1", "t", tmp_path / "c.png") is None


def test_an_axis_without_costs_is_left_blank(tmp_path):
    """Offline data of unknown cost (an older demo's results): the passes panel alone is drawn."""
    points = [CostPoint("offline", 0, 1, 0.3, 0.0), CostPoint("offline+humanline", 0, 1, 0.4, 0.0)]
    assert cost_score_figure(points, "pass@1", "t", tmp_path / "c.png") is not None


@pytest.mark.parametrize("regime, passes", [("offline", 1), ("offline+humanline", 1), ("online", 32),
                                            ("sparse8+humanline", 4), ("sparse", 4), ("rounds8", 4),
                                            ("stale4", 28), ("stale64", 1), ("online+nll0.1", 32)])
def test_sampling_passes_by_regime(regime, passes):
    """32 steps, the command's sparse period 8: the policy versions that sample."""
    from humanline.experiments.harness.cost_score import sampling_passes

    assert sampling_passes(regime, 32, 8) == passes


def test_the_records_script_draws_the_committed_dpo_picture_from_lab_records(tmp_path, capsys, monkeypatch):
    """scripts/experiments/cost_plot.py on the records behind docs/images/cost_dpo_chain_t13.png: each regime's
    point is its seeds' mean final score, offline pays its data's tokens in one pass, sparse8 4 passes."""
    out = tmp_path / "cost.png"
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "experiments"))
    monkeypatch.setattr(sys, "argv", ["cost_plot.py", str(ROOT / "lab/records/2026-12-07-chain-t13-sparse"),
                                      str(ROOT / "lab/records/2026-11-29-chain-t13"), "--objective", "dpo",
                                      "--regimes", "offline", "online", "sparse8+humanline", "--title", "t",
                                      "--out", str(out)])
    runpy.run_path(str(ROOT / "scripts/experiments/cost_plot.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "offline: 0.301 ± 0.014 over 5 seeds, 40.6 k tokens, 1 passes" in printed
    assert "online: 0.670 ± 0.046 over 5 seeds, 29.2 k tokens, 32 passes" in printed
    assert "sparse8+humanline: 0.696 ± 0.030 over 5 seeds, 24.1 k tokens, 4 passes" in printed
    assert out.stat().st_size > 10_000
    monkeypatch.setattr(sys, "argv", ["cost_plot.py", str(ROOT / "lab/records/2026-12-07-chain-t13-sparse"),
                                      "--objective", "dpo", "--regimes", "offline", "--title", "t", "--out",
                                      str(out)])
    with pytest.raises(SystemExit, match="no dpo runs of regime 'offline'"):
        runpy.run_path(str(ROOT / "scripts/experiments/cost_plot.py"), run_name="__main__")


def test_the_records_table_pairs_by_seed_and_shows_no_standard_error_for_one_seed(capsys, monkeypatch):
    """scripts/experiments/records_table.py on committed records: the DPO sparse table's sparse8+humanline row
    (mean ± se over five seeds, the paired difference to online) and a one-seed tuning row, which has a mean and
    no standard error (not `± nan`)."""
    def table(*argv: str) -> dict[str, str]:
        monkeypatch.setattr(sys, "argv", ["records_table.py", *argv])
        runpy.run_path(str(ROOT / "scripts/experiments/records_table.py"), run_name="__main__")
        return {line.split(" | ")[0].lstrip("| "): line for line in capsys.readouterr().out.splitlines()}

    rows = table(str(ROOT / "lab/records/2026-12-07-chain-t13-sparse"), str(ROOT / "lab/records/2026-11-29-chain-t13"),
                 "--objective", "dpo", "--against", "online", "--regimes", "sparse8+humanline", "online")
    assert "| 0.696 ± 0.030 | 0.761 / 0.686 / 0.691 / 0.750 / 0.591 | +0.026 ± 0.051 (5, 0.5 se) |" in \
        rows["sparse8+humanline"]
    rows = table(str(ROOT / "lab/records/2026-12-07-chain-t13-nll-tuning"),
                 str(ROOT / "lab/records/2026-11-29-chain-t13-tuning"), "--objective", "dpo", "--against",
                 "offline+humanline", "--regimes", "offline+humanline-nll0.2")
    assert "| offline+humanline-nll0.2 | 0.180 | 0.180 | -0.044 (1) |" in rows["offline+humanline-nll0.2"]
    assert "nan" not in rows["offline+humanline-nll0.2"]
