"""`humanline reproduce`: the task, the settings, each run's config, skipping and resuming runs, and the
results' arithmetic (hand-computed on synthetic run summaries)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from helpers_reproduce import tiny_reproduce_data
from humanline.errors import UserError
from humanline.experiments.harness.regimes import NO_SYNC, regime_overrides
from humanline.experiments.reproduce import results as res
from humanline.experiments.reproduce.declines import fallen_table, fell
from humanline.experiments.reproduce.keys import run_key
from humanline.experiments.reproduce.runs import (
    finished_summary,
    replaced_runs,
    run_all,
    run_config,
    run_name,
    train_run,
)
from humanline.experiments.reproduce.settings import ReproduceSettings
from humanline.experiments.reproduce.task import KINDS, sum_records
from humanline.files import write_jsonl

# ---- the task ---------------------------------------------------------------------------------------------

def test_train_and_held_out_sums_are_disjoint_and_answered_correctly():
    train, held_out = sum_records(seed=0, n_train=300, n_held_out=150)
    assert (len(train), len(held_out)) == (300, 150)
    ids = [r["id"] for r in train + held_out]
    assert len(set(ids)) == len(ids)  # no sum twice, so none held out is trained on
    for record in train + held_out:
        a, b = map(int, record["id"].removeprefix("sum-").split("+"))
        assert record["answer"] == str(a + b)
        assert f"What is {a} + {b}?" in record["prompt"][-1]["content"]
    # the kinds take turns: the first three records are small, 2d1d and 2d2d sums
    ranges = list(KINDS.values())
    for i, record in enumerate(train[:9]):
        a, b = map(int, record["id"].removeprefix("sum-").split("+"))
        (lo_a, hi_a), (lo_b, hi_b) = ranges[i % 3]
        assert lo_a <= a <= hi_a and lo_b <= b <= hi_b


def test_the_task_is_the_same_for_the_same_seed_and_differs_for_another():
    assert sum_records(seed=0, n_train=30, n_held_out=6) == sum_records(seed=0, n_train=30, n_held_out=6)
    assert sum_records(seed=0, n_train=30, n_held_out=6) != sum_records(seed=1, n_train=30, n_held_out=6)


def test_asking_for_more_sums_than_a_kind_holds_is_refused():
    with pytest.raises(ValueError, match="smallest kind"):
        sum_records(n_train=1500, n_held_out=500)  # 667 small sums of the 625 that exist


# ---- settings and regimes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, flag", [
    ({"objectives": ["ppo"]}, "--objective"),
    ({"regimes": ["offline", "onlin"]}, "--regimes"),
    ({"regimes": ["sparse0+humanline"]}, "--regimes"),
    ({"seeds": 0}, "--seeds"),
    ({"steps": 2, "evals": 3}, "--steps"),
    ({"model": "gpt2"}, "unknown model"),
    ({"lr": 0.0}, "--lr"),
    ({"lr": 2.0}, "--lr"),
])
def test_bad_settings_name_the_flag(changes, flag):
    with pytest.raises(UserError, match=flag):
        ReproduceSettings(**changes).check()


def test_sparse_with_a_period_samples_every_that_many_steps():
    assert regime_overrides("sparse64+humanline")["train"] == {"regime": "sparse", "sample_every": 64}
    assert regime_overrides("sparse")["train"] == {"regime": "sparse"}
    assert regime_overrides("sparse7")["train"] == {"regime": "sparse", "sample_every": 7}


def test_stale_regimes_and_corrections_by_name():
    """stale<N> is the stale regime at eta = N; a correction alone is a variant, beside humanline an option; a
    correction on offline data (no sampler policy) or an unknown option names the regime."""
    assert regime_overrides("stale16") == {"train": {"regime": "stale", "staleness": 16}}
    assert regime_overrides("stale4+tis") == {"train": {"regime": "stale", "staleness": 4},
                                              "objective": {"correction": "tis"}}
    both = regime_overrides("stale16+humanline-k4-decoupled")
    assert both["objective"] == {"correction": "decoupled"} and both["humanline"] == {"enabled": True, "sync_every": 4}
    assert regime_overrides("online+m2po")["objective"] == {"correction": "m2po"}
    with pytest.raises(UserError, match=r"'offline\+drop': a correction needs sampled data"):
        regime_overrides("offline+drop")
    with pytest.raises(UserError, match=r"cannot read the options '-tisx'"):
        regime_overrides("stale16+humanline-tisx")
    with pytest.raises(UserError, match=r"'stale16\+foo': expected stale16\+ followed by one of .*m2po"):
        regime_overrides("stale16+foo")
    with pytest.raises(UserError, match=r"sparse<N> \(N >= 1\), rounds<N> \(N >= 1\) or stale<N>"):
        regime_overrides("sparse0")


def test_the_stale_table_shows_each_sampled_rows_age_and_correction_and_pairs_variants_with_their_plain_eta():
    def run(regime, seed, final, **mechanism):
        return {**_run(regime, seed, [final], [10]), "generated_tokens": 1000 + seed, **mechanism}
    runs = [run("offline", 0, 0.3), run("online", 0, 0.5, staleness=0.0),
            run("stale16", 0, 0.3, staleness=8.5), run("stale16", 1, 0.4, staleness=8.5),
            run("stale16+tis", 0, 0.4, staleness=8.5, masked=0.0, capped=0.25, ess=0.8),
            run("stale16+tis", 1, 0.45, staleness=8.5, masked=0.0, capped=0.35, ess=0.9)]
    rows = res.aggregate({"runs": runs, "data": {"offline": None}})
    lines = res.stale_table(rows)
    assert "| grpo | stale16+tis | 8.5 | 0.000 | 0.300 | 0.850 | 1000 |" in lines
    assert "| grpo | stale16 | 8.5 | — | — | — | 1000 |" in lines and not any("| offline |" in x for x in lines)
    assert [(a["regime"], b["regime"]) for a, b in res.comparisons(rows)] == [("stale16+tis", "stale16")]
    assert "| grpo | stale16+tis | stale16 | +0.075 ± 0.025 | 2 | +3.0 |" in res.comparison_table(rows)
    assert res.stale_table([r for r in rows if not r["regime"].startswith("stale")]) == []


DATA = {"groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}


def test_each_run_takes_the_objective_settings_and_its_regime_over_them(tmp_path):
    s = ReproduceSettings(model="tiny", steps=12, evals=3, prompts_per_step=2)
    k1 = run_config(s, DATA, "grpo", "offline+humanline-k1", 5, tmp_path)
    assert (k1.humanline.enabled, k1.humanline.sync_every, k1.humanline.low) == (True, 1, -1.5)
    assert (k1.train.seed, k1.train.max_steps, k1.train.eval_every, k1.train.micro_batch_size) == (5, 12, 4, 2)
    assert k1.train.sample_every == 1 and k1.rollout.stop == ["\n"] and k1.optim.lr == 1e-5
    sparse = run_config(s, DATA, "grpo", "sparse4+humanline", 0, tmp_path)
    assert (sparse.train.regime, sparse.train.sample_every, sparse.humanline.sync_every) == ("sparse", 4, 1)
    plain = run_config(s, DATA, "grpo", "offline", 0, tmp_path)
    assert plain.humanline.enabled is False
    stale = run_config(s, DATA, "grpo", "stale4+humanline-tis", 0, tmp_path)
    assert (stale.train.regime, stale.train.staleness, stale.train.sample_every) == ("stale", 4, 1)
    assert (stale.objective.correction, stale.humanline.enabled, stale.objective.eps_low) == ("tis", True, 0.2)
    with pytest.raises(UserError, match="objective.correction"):  # the corrections reweigh GRPO's ratio only
        run_config(s, DATA, "dpo", "stale4+tis", 0, tmp_path)
    kto = run_config(s, DATA, "kto", "offline+humanline-auto", 0, tmp_path)
    assert kto.train.micro_batch_size == 4  # the best and the worst of each of 2 groups
    assert kto.humanline.band == "auto"
    # every part of the ablation loads under KTO's own auto band: sync-only has no clip, so no band to calibrate
    sync_only = run_config(s, DATA, "kto", "offline+sync-only-k4", 0, tmp_path).humanline
    assert (sync_only.transform, sync_only.band, sync_only.sync_every) == ("none", "fixed", 4)
    clip_only = run_config(s, DATA, "kto", "offline+clip-only", 0, tmp_path).humanline
    assert (clip_only.transform, clip_only.band, clip_only.sync_every) == ("clip", "auto", NO_SYNC)
    with pytest.raises(UserError) as info:  # the stochastic form needs fixed bounds: the error says how to name them
        run_config(s, DATA, "kto", "offline+reject", 0, tmp_path)
    assert "--regimes: 'offline+reject'" in str(info.value) and "offline+reject-band-1.5,1.5" in str(info.value)
    with pytest.raises(UserError) as info:  # a band the name itself sets gets no advice to name another
        run_config(s, DATA, "dpo", "offline+reject-auto", 0, tmp_path)
    assert "--regimes: 'offline+reject-auto'" in str(info.value) and "-band-1.5,1.5" not in str(info.value)
    assert run_config(s, DATA, "kto", "offline+reject-band-1.5,1.5", 0, tmp_path).humanline.band == "fixed"


def test_a_run_whose_config_cannot_load_stops_reproduce_before_anything_is_made(tmp_path):
    """The stochastic form under KTO's own auto band cannot load: reproduce says so (and the fix) before it samples
    the offline data or makes the output folder."""
    s = ReproduceSettings(model="tiny", steps=12, evals=3, prompts_per_step=2, objectives=["kto"],
                          regimes=["offline", "offline+reject"])
    with pytest.raises(UserError, match=r"--regimes: 'offline\+reject'.*offline\+reject-band-1.5,1.5"):
        run_all(s, tmp_path / "out", print)
    assert not (tmp_path / "out").exists()


def test_dpo_and_kto_take_the_reasoning_gym_learning_rate_there_as_if_it_were_given(tmp_path):
    """On a reasoning-gym task DPO and KTO run at 2e-5 by default: the runs `--lr 2e-5` made, same folder and key."""
    data = {"groups": "/o/data/g.jsonl", "prompts": "/o/data/p.jsonl", "eval_prompts": "/o/data/e.jsonl"}
    default, given = ReproduceSettings(task="add"), ReproduceSettings(task="add", lr=2e-5)
    for objective in ("dpo", "kto"):
        assert default.lr_of(objective) == 2e-5 and ReproduceSettings().lr_of(objective) is None  # sums: its own
        cfgs = [run_config(x, data, objective, "offline", 0, tmp_path) for x in (default, given)]
        assert cfgs[0].optim.lr == 2e-5 and run_key(cfgs[0], tmp_path) == run_key(cfgs[1], tmp_path)
    assert default.lr_of("grpo") is None and run_config(default, data, "grpo", "online", 0, tmp_path).optim.lr == 1e-5
    assert run_name("dpo", "online", 0, default.lr_of("dpo")) == "dpo-online-lr2e-05-seed0"


def test_another_learning_rate_runs_in_folders_of_its_own_and_auto_keys_its_target(tmp_path):
    s = ReproduceSettings(model="tiny", steps=12, evals=3, lr=2.5e-6)
    assert run_config(s, DATA, "grpo", "offline", 0, tmp_path).optim.lr == 2.5e-6
    assert run_name("grpo", "offline+humanline-k1", 3, s.lr) == "grpo-offline-humanline-k1-lr2.5e-06-seed3"
    assert run_name("grpo", "offline", 3) == "grpo-offline-seed3"
    auto = run_config(s, DATA, "grpo", "offline+humanline-kauto", 0, tmp_path)
    target = run_config(s, DATA, "grpo", "offline+humanline-kauto0.02", 0, tmp_path)
    assert auto.humanline.sync_every == "auto" and target.humanline.sync_drift == 0.02
    assert run_key(auto, tmp_path) != run_key(target, tmp_path)  # the target keys an auto run; a fixed k ignores it
    fixed = run_config(s, DATA, "grpo", "offline+humanline-k1", 0, tmp_path)
    fixed_other = run_config(s, DATA, "grpo", "offline+humanline-k1", 0, tmp_path)
    fixed_other.humanline.sync_drift = 0.5
    assert run_key(fixed, tmp_path) == run_key(fixed_other, tmp_path)


def test_run_keys_stay_those_of_finished_runs_when_the_config_gains_a_field():
    """Finished runs are found by the key of their config (`keys.run_key`): a hash of the fields that differ from
    their defaults, paths under the output folder written relative to it, so a field added later at its default
    keeps every key. These keys were computed when that rule was introduced; a change to them orphans every cached
    run."""
    data = {"groups": "/data/offline_groups.jsonl", "prompts": "/data/train_prompts.jsonl",
            "eval_prompts": "/data/eval_prompts.jsonl"}
    keys = {(o, r): run_key(run_config(ReproduceSettings(), data, o, r, 0, Path("/out/runs/x")), Path("/out"))
            for o, r in (("grpo", "offline"), ("grpo", "online"), ("kto", "offline+humanline-k1-auto"))}
    assert keys == {("grpo", "offline"): "1943a1ce3ebe12a5", ("grpo", "online"): "8a8f19afe5745fe4",
                    ("kto", "offline+humanline-k1-auto"): "795ca188bd867dbe"}
    bf16 = run_config(ReproduceSettings(), data, "grpo", "online", 0, Path("/out/runs/x"))
    bf16.rollout.dtype = "bfloat16"
    assert run_key(bf16, Path("/out")) != keys[("grpo", "online")]  # away from its default, the field counts
    bf16.rollout.dtype = type(bf16.rollout)().dtype
    assert run_key(bf16, Path("/out")) == keys[("grpo", "online")]  # set to its default: the same run


# ---- a run is started, skipped when finished, continued when interrupted ---------------------------------

def test_a_finished_run_is_read_back_and_an_interrupted_one_continues(tmp_path):
    data, out = tiny_reproduce_data(tmp_path), tmp_path / "out"
    s = ReproduceSettings(model="tiny", steps=4, evals=2, prompts_per_step=2, max_new_tokens=4, eval_samples=1,
                          save_every=2)
    first = train_run(s, data, "grpo", "offline+humanline", 0, out)
    run_dir = out / "runs" / run_name("grpo", "offline+humanline", 0)
    assert first["steps"] == 4 and [p["step"] for p in first["curve"]] == [2, 4]
    assert not (run_dir / "checkpoints").exists()  # removed once finished; the final model stays
    assert (run_dir / "final").is_dir()
    again = train_run(s, data, "grpo", "offline+humanline", 0, out)
    assert again["cached"] is True and again["key"] == first["key"]
    assert finished_summary(s, data, "grpo", "offline+humanline", 0, out)["final_pass@1"] == first["final_pass@1"]
    assert finished_summary(s, data, "grpo", "offline", 0, out) is None  # never run

    # other settings: refused, naming what differs; the finished run is left as it was
    s2 = ReproduceSettings(**{**s.__dict__, "steps": 2, "evals": 1})
    before = {p.name: p.read_bytes() for p in run_dir.glob("*.json*")}
    with pytest.raises(UserError, match=r"other settings \(.*train.max_steps 4 there, 2 here.*remove the folder"):
        train_run(s2, data, "grpo", "offline+humanline", 0, out)
    assert replaced_runs(s2, data, "grpo", "offline+humanline", 0, out).startswith(run_dir.name)
    assert replaced_runs(s, data, "grpo", "offline+humanline", 0, out) is None
    assert {p.name: p.read_bytes() for p in run_dir.glob("*.json*")} == before
    with pytest.raises(UserError, match="1 run folder"):  # the whole command checks every run before it starts
        run_all(s2, out, log=lambda m: None)
    # with the folder removed, the same settings start afresh
    shutil.rmtree(run_dir)
    other = train_run(s2, data, "grpo", "offline+humanline", 0, out)
    assert "cached" not in other and other["resumed_at_step"] == 0 and other["steps"] == 2
    assert json.loads((run_dir / "reproduce.json").read_text())["key"] == other["key"] != first["key"]


def test_a_moved_output_folder_keeps_its_runs(tmp_path):
    data, out = tiny_reproduce_data(tmp_path), tmp_path / "out"
    s = ReproduceSettings(model="tiny", steps=2, evals=1, prompts_per_step=2, max_new_tokens=4, eval_samples=1)
    first = train_run(s, data, "grpo", "offline", 0, out)
    moved = tmp_path / "elsewhere" / "out"
    moved.parent.mkdir()
    out.rename(moved)
    again = train_run(s, data, "grpo", "offline", 0, moved)
    assert again["cached"] is True and again["final_pass@1"] == first["final_pass@1"]
    run_dir = moved / "runs" / run_name("grpo", "offline", 0)
    assert run_key(run_config(s, data, "grpo", "offline", 0, run_dir), moved) == first["key"]
    moved.rename(out)
    assert train_run(s, data, "grpo", "offline", 0, out)["cached"] is True


def test_a_run_folder_copied_next_to_other_data_is_not_taken_for_a_run_on_it(tmp_path):
    s = ReproduceSettings(model="tiny", steps=2, evals=1, prompts_per_step=2, max_new_tokens=4, eval_samples=1)
    outs = [tmp_path / "a", tmp_path / "b"]
    data = [tiny_reproduce_data(out / "data") for out in outs]  # inside each output folder, as reproduce puts it
    groups = Path(data[1]["groups"])
    groups.write_text(groups.read_text().replace("no idea", "not sure"))  # b's offline data differ
    train_run(s, data[0], "grpo", "offline", 0, outs[0])
    name = run_name("grpo", "offline", 0)
    shutil.copytree(outs[0] / "runs" / name, outs[1] / "runs" / name)
    with pytest.raises(UserError, match="the same settings, other content in the data files"):
        train_run(s, data[1], "grpo", "offline", 0, outs[1])
    shutil.copytree(outs[0] / "data", tmp_path / "c" / "data")  # the whole folder copied: its runs come along
    shutil.copytree(outs[0] / "runs", tmp_path / "c" / "runs")
    copied = {k: v.replace(str(outs[0]), str(tmp_path / "c")) for k, v in data[0].items()}
    assert train_run(s, copied, "grpo", "offline", 0, tmp_path / "c")["cached"] is True


def test_a_run_stopped_mid_way_continues_from_its_checkpoint(tmp_path, monkeypatch):
    import os
    import signal

    from humanline.training.loop import Trainer

    data, out = tiny_reproduce_data(tmp_path), tmp_path / "out"
    s = ReproduceSettings(model="tiny", steps=4, evals=2, prompts_per_step=2, max_new_tokens=4, eval_samples=1,
                          save_every=2)
    real_step, starts = Trainer.train_step, {}

    def step_then_sigterm(self):  # the first run gets SIGTERM during step 3 (as a killed job would)
        starts.setdefault(id(self), self.step)  # the step each trainer starts from
        record = real_step(self)
        if len(starts) == 1 and self.step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return record

    monkeypatch.setattr(Trainer, "train_step", step_then_sigterm)
    assert train_run(s, data, "grpo", "offline", 0, out)["stopped"] is True
    summary = train_run(s, data, "grpo", "offline", 0, out)
    assert list(starts.values()) == [0, 3]  # the signal's checkpoint is at step 3: continued from there
    assert summary["resumed_at_step"] == 3 and summary["steps"] == 4  # every step logged once


def test_report_without_data_says_to_run_first(tmp_path):
    with pytest.raises(UserError, match="run without --report first"):
        run_all(ReproduceSettings(model="tiny"), tmp_path, log=lambda m: None, finished_only=True)


def test_a_relative_output_dir_names_the_same_runs_as_its_absolute_path(tmp_path, monkeypatch):
    """Run keys hold paths: the output folder is made absolute before any key is computed."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        run_all(ReproduceSettings(model="tiny"), Path("rel"), log=lambda m: None, finished_only=True)
    assert str(tmp_path.resolve() / "rel" / "data") in str(err.value), err.value


def test_report_names_runs_that_finished_with_other_settings(tmp_path, monkeypatch, capsys):
    from helpers_reliability import run_cli
    from humanline.commands import reproduce as command

    monkeypatch.setattr(command, "run_all", lambda *a, **k: {"runs": [], "complete": False})
    out = tmp_path / "o"
    code, lines = run_cli(["reproduce", "smollm2", "--report", "--output-dir", str(out)], capsys)
    assert code != 0 and any("no finished run" in line and "other settings" not in line for line in lines), lines
    (out / "runs" / "grpo-offline-seed0").mkdir(parents=True)
    (out / "runs" / "grpo-offline-seed0" / "summary.json").write_text("{}")
    code, lines = run_cli(["reproduce", "smollm2", "--report", "--output-dir", str(out)], capsys)
    assert code != 0 and any("1 run folder(s) there finished with other settings (grpo-offline-seed0)" in line
                             for line in lines), lines


# ---- results: hand-computed ------------------------------------------------------------------------------

def _run(regime, seed, finals, seconds, gen=0.0):
    curve = [{"step": 10 * (i + 1), "pass@1": p, "stderr": 0.02, "seconds": s} for i, (p, s) in
             enumerate(zip(finals, seconds))]
    return {"objective": "grpo", "regime": regime, "seed": seed, "final_pass@1": finals[-1], "final_stderr": 0.02,
            "curve": curve, "seconds": {"generation": gen, "reward": 0.0, "train": seconds[-1] - gen,
                                        "step": seconds[-1], "eval": 5.0},
            "humanline": {}, "ppo_clip_fraction": None}


def test_results_pair_by_seed_and_time_the_way_to_online():
    runs = [_run("offline", 0, [0.20, 0.30], [10, 20]), _run("offline", 1, [0.20, 0.34], [10, 20]),
            _run("offline+humanline", 0, [0.30, 0.40], [10, 20]), _run("offline+humanline", 1, [0.40, 0.44], [10, 20]),
            _run("online", 0, [0.30, 0.42], [30, 60], gen=24), _run("online", 1, [0.34, 0.46], [30, 60], gen=24)]
    results = {"runs": runs, "data": {"offline": {"seconds": 7.0}}}
    rows = {r["regime"]: r for r in res.aggregate(results)}
    hl, on = rows["offline+humanline"], rows["online"]
    assert hl["pass@1"]["mean"] == pytest.approx(0.42)
    assert hl["pass@1"]["std"] == pytest.approx(math.sqrt(2) * 0.02)  # values 0.40, 0.44
    assert hl["vs_offline"]["mean"] == pytest.approx(0.10)  # 0.10 and 0.10
    assert hl["vs_offline"]["se"] == pytest.approx(0.0, abs=1e-12)
    assert hl["vs_online"]["mean"] == pytest.approx(-0.02)  # -0.02 and -0.02
    assert hl["gap_closed"] == pytest.approx((0.42 - 0.32) / (0.44 - 0.32))
    # online's final mean 0.44: humanline's mean curve 0.35, 0.42 never reaches it; online reaches it at 60 s
    assert hl["time_to_online"] is None and hl["speedup"] is None
    assert on["time_to_online"] == 60 and on["sampling_share"] == pytest.approx(24 / 60)
    assert hl["data_seconds"] == 7.0 and on["data_seconds"] == 0.0


def test_sparse_variants_meet_plain_sparse_and_the_drift_rule_meets_each_fixed_k():
    """Per seed: sparse8+humanline-k1 - sparse8 = 0.10, 0.14 -> 0.12 ± 0.02 (z 6.0); the drift rule against k1:
    0.0, -0.04 -> -0.02 ± 0.02; against k16: 0.2, 0.2 -> 0.2 ± 0 (z inf). offline+humanline-k4 meets nothing
    (no plain sparse and not the drift rule), and online never."""
    finals = {"sparse8": (0.30, 0.30), "sparse8+humanline-k1": (0.40, 0.44), "sparse8+humanline-kauto": (0.40, 0.40),
              "sparse8+humanline-k16": (0.20, 0.20), "offline+humanline-k4": (0.3, 0.3), "online": (0.5, 0.5)}
    runs = [_run(regime, seed, [value], [10]) for regime, values in finals.items() for seed, value in enumerate(values)]
    rows = res.aggregate({"runs": runs, "data": {"offline": None}})
    pairs = [(a["regime"], b["regime"]) for a, b in res.comparisons(rows)]
    assert pairs == [("sparse8+humanline-k1", "sparse8"), ("sparse8+humanline-kauto", "sparse8"),
                     ("sparse8+humanline-kauto", "sparse8+humanline-k1"),
                     ("sparse8+humanline-kauto", "sparse8+humanline-k16"), ("sparse8+humanline-k16", "sparse8")]
    lines = res.comparison_table(rows)
    assert "| grpo | sparse8+humanline-k1 | sparse8 | +0.120 ± 0.020 | 2 | +6.0 |" in lines
    assert "| grpo | sparse8+humanline-kauto | sparse8+humanline-k1 | -0.020 ± 0.020 | 2 | -1.0 |" in lines
    assert "| grpo | sparse8+humanline-kauto | sparse8+humanline-k16 | +0.200 ± 0.000 | 2 | +inf |" in lines


def test_no_gap_closed_when_online_is_not_above_offline():
    runs = [_run("offline", 0, [0.3, 0.40], [10, 20]), _run("offline+humanline", 0, [0.3, 0.35], [10, 20]),
            _run("online", 0, [0.3, 0.38], [30, 60])]
    rows = {r["regime"]: r for r in res.aggregate({"runs": runs, "data": {"offline": {"seconds": 1.0}}})}
    assert all(r["gap_closed"] is None for r in rows.values())  # not -0.05 / -0.02 = 250%
    data = {"base": {"pass@1": 0.3, "pass@1_stderr": 0.05}, "offline": None}
    humanline_row = next(line for line in res.table(list(rows.values()), data).splitlines()
                         if line.startswith("| grpo | offline+humanline |"))
    assert humanline_row.split(" | ")[6] == "n/a"  # the gap-closed cell: offline and online ran, no gap
    assert res.gap_closed(0.35, 0.30, 0.40) == pytest.approx(0.5) and res.gap_closed(0.35, 0.40, 0.40) is None


def test_final_models_are_compared_by_seed_when_every_run_has_their_evaluation():
    finals = {("offline", 0): 0.25, ("offline", 1): 0.35, ("offline+humanline", 0): 0.30,
              ("offline+humanline", 1): 0.44, ("online", 0): 0.45, ("online", 1): 0.55}
    runs = [_run(regime, seed, [0.2, 0.3], [10, 20]) for regime, seed in finals]
    data = {"offline": {"seconds": 1.0, "groups_kept": 1, "groups": 2, "samples_per_prompt": 8},
            "base": {"pass@1": 0.1, "pass@1_stderr": 0.01, "quality": {"mean": -1, "q25": -2, "q50": -1, "q75": 0}}}
    assert all(r["final_models"] is None for r in res.aggregate({"runs": runs, "data": data}))
    assert "Final models" not in res.table(res.aggregate({"runs": runs, "data": data}), data)
    for r in runs:
        r["final_eval"] = {"samples": 8, "pass@1": finals[(r["regime"], r["seed"])], "stderr": 0.01}
    rows = {r["regime"]: r for r in res.aggregate({"runs": runs, "data": data})}
    f = rows["offline+humanline"]["final_models"]
    assert f["pass@1"]["mean"] == pytest.approx(0.37) and f["per_seed"] == {0: 0.30, 1: 0.44}
    assert f["vs_offline"]["mean"] == pytest.approx(0.07)  # +0.05 and +0.09
    assert f["vs_offline"]["se"] == pytest.approx(0.02)  # std of (0.05, 0.09) is 0.04*sqrt(1/2); / sqrt(2)
    assert f["vs_online"]["mean"] == pytest.approx(-0.13)  # -0.15 and -0.11
    assert f["gap_closed"] == pytest.approx((0.37 - 0.30) / (0.50 - 0.30))
    assert rows["offline"]["final_models"]["vs_offline"] is None
    text = res.table(list(rows.values()), {**data, "base_final": {"samples": 8, "pass@1": 0.1, "stderr": 0.01}})
    assert "Final models, 8 samples per held-out prompt" in text and "the base policy 0.100 ± 0.010 (se)" in text
    row = "| grpo | offline+humanline | 0.370 ± 0.099 | 0.300 / 0.440 | +0.070 ± 0.020 | -0.130 ± 0.020 | 35% |"
    assert row in text
    lines = res.verdict(list(rows.values()))
    assert any("final models at 8 samples per prompt, 0.370: below online by more than its std; above offline by "
               "more than 2 paired standard errors" in v for v in lines), lines
    del runs[0]["final_eval"]  # one offline run without it: no paired comparison with offline
    rows = {r["regime"]: r for r in res.aggregate({"runs": runs, "data": data})}
    assert rows["offline"]["final_models"] is None and rows["offline+humanline"]["final_models"]["vs_offline"] is None


def test_the_final_model_is_evaluated_once_with_the_same_draws_and_read_back(tmp_path, monkeypatch):
    from humanline.experiments.reproduce import runs as R

    data, out = tiny_reproduce_data(tmp_path), tmp_path / "out"
    s = ReproduceSettings(model="tiny", steps=2, evals=1, prompts_per_step=2, max_new_tokens=4, final_samples=3)
    calls, real = [], R.evaluate_generations

    def recording(model, tokenizer, records, reward, *, gen, **kwargs):
        calls.append((len(records), gen.n, gen.seed))
        return real(model, tokenizer, records, reward, gen=gen, **kwargs)

    monkeypatch.setattr(R, "evaluate_generations", recording)
    first = train_run(s, data, "grpo", "offline", 0, out)
    other_seed = train_run(s, data, "grpo", "offline", 1, out)
    assert calls == [(4, 3, R.FINAL_EVAL_SEED)] * 2  # 4 held-out prompts x 3 samples, one seed for every run
    final = first["final_eval"]
    assert final["samples"] == 3 and final["prompts"] == 4 and 0 <= final["pass@1"] <= 1
    assert other_seed["final_eval"]["key"] != final["key"]  # another run: its own key
    again = train_run(s, data, "grpo", "offline", 0, out)  # finished: read back, not evaluated again
    assert again["cached"] is True and again["final_eval"] == final and len(calls) == 2
    assert finished_summary(s, data, "grpo", "offline", 0, out)["final_eval"] == final  # --report reads it
    more = ReproduceSettings(**{**s.__dict__, "final_samples": 5})
    assert "final_eval" not in finished_summary(more, data, "grpo", "offline", 0, out)  # --report measures nothing
    assert train_run(more, data, "grpo", "offline", 0, out)["final_eval"]["samples"] == 5 and len(calls) == 3
    none = ReproduceSettings(**{**s.__dict__, "final_samples": 0})
    assert "final_eval" not in train_run(none, data, "grpo", "offline", 0, out)
    # the base model, by its name, on the same draws (read back the second time)
    base = R.final_eval(s, data, "tiny", tmp_path / "base.json", "base:tiny")
    assert calls[-1] == (4, 3, R.FINAL_EVAL_SEED) and len(calls) == 4 and base["samples"] == 3
    assert R.final_eval(s, data, "tiny", tmp_path / "base.json", "base:tiny", make=False) == base
    assert R.final_eval(s, data, "tiny", tmp_path / "base.json", "base:tiny") == base and len(calls) == 4
    assert R.final_eval(none, data, "tiny", tmp_path / "base.json", "base:tiny") is None


@pytest.mark.parametrize("value", [-1, 1.5])
def test_a_bad_final_samples_names_the_flag(value):
    with pytest.raises(UserError, match="--final-samples"):
        ReproduceSettings(final_samples=value).check()


def test_time_to_target_adds_the_offline_data_once_and_gives_the_speed_up():
    runs = [_run("offline+humanline", 0, [0.45, 0.5], [10, 20]), _run("online", 0, [0.2, 0.44], [30, 60]),
            _run("offline", 0, [0.2, 0.3], [10, 20])]
    rows = {r["regime"]: r for r in res.aggregate({"runs": runs, "data": {"offline": {"seconds": 5.0}}})}
    assert rows["offline+humanline"]["time_to_online"] == 15.0  # first evaluation (10 s) + the data (5 s)
    assert rows["offline+humanline"]["speedup"] == pytest.approx(60 / 15)
    assert rows["offline"]["time_to_online"] is None
    lines = res.verdict(list(rows.values()))
    assert any("offline+humanline 0.500" in v and "4.00x sooner" in v for v in lines)


# ---- the data: made once per key; never replaced under runs that trained on it ------------------------------

def _fake_data_steps(monkeypatch, made: list):
    from humanline.experiments.reproduce import data as D

    def sample(settings, records, folder, log):
        made.append(("offline", D.data_temperature(settings)))
        write_jsonl(folder / "offline_groups.jsonl", [])
        return {"groups": 0, "groups_kept": 0, "generated_tokens": 0, "seconds": 0.0}

    def base(settings, folder, log, with_quality=True):
        made.append(("base", settings.temperature) if with_quality else ("base without quality", settings.temperature))
        quality = {"quality": {"mean": -1.0, "q25": -1.0, "q50": -1.0, "q75": -1.0}} if with_quality else {}
        return {"pass@1": 0.0, "pass@1_stderr": 0.0, **quality}

    monkeypatch.setattr(D, "sample_offline", sample)
    monkeypatch.setattr(D, "measure_base", base)
    return D


def test_the_data_temperature_makes_its_own_data_and_keeps_the_default_key(tmp_path, monkeypatch):
    made: list = []
    D = _fake_data_steps(monkeypatch, made)
    plain = ReproduceSettings(model="tiny", train_prompts=12, eval_prompts=4, offline_prompts=4)
    same = ReproduceSettings(**{**plain.__dict__, "data_temperature": 1.0})
    cooler = ReproduceSettings(**{**plain.__dict__, "data_temperature": 0.7})
    assert D.offline_key(plain) == D.offline_key(same) != D.offline_key(cooler)
    D.prepare_data(plain, tmp_path / "a", log=lambda m: None)
    D.prepare_data(same, tmp_path / "a", log=lambda m: None)  # cached: nothing made again
    D.prepare_data(cooler, tmp_path / "b", log=lambda m: None)
    assert made == [("offline", 1.0), ("base", 1.0), ("offline", 0.7), ("base", 1.0)]
    assert D.generation(cooler, 8, seed=0, temperature=D.data_temperature(cooler)).temperature == 0.7
    assert D.generation(cooler, 1, seed=0).temperature == 1.0  # the base's evaluation: the runs' temperature


def test_the_data_log_says_what_was_sampled_and_from_where(tmp_path, monkeypatch):
    D = _fake_data_steps(monkeypatch, [])
    small = dict(model="tiny", train_prompts=12, eval_prompts=4, offline_prompts=4)
    lines: list[str] = []
    D.prepare_data(ReproduceSettings(**small, offline_source="reference"), tmp_path / "r", log=lines.append)
    assert any("made from the source 'reference', nothing sampled, in 0 s" in line for line in lines), lines
    real = D.sample_offline
    monkeypatch.setattr(D, "sample_offline", lambda *a: {**real(*a), "generated_tokens": 7})
    D.prepare_data(ReproduceSettings(**small), tmp_path / "b", log=lines.append)
    assert any("7 tokens sampled from the base policy at T = 1 in 0 s" in line for line in lines), lines


def test_data_that_runs_trained_on_is_not_replaced(tmp_path, monkeypatch):
    made: list = []
    D = _fake_data_steps(monkeypatch, made)
    plain = ReproduceSettings(model="tiny", train_prompts=12, eval_prompts=4, offline_prompts=4)
    cooler = ReproduceSettings(**{**plain.__dict__, "data_temperature": 0.7})
    out = tmp_path / "out"
    D.prepare_data(plain, out, log=lambda m: None)
    D.prepare_data(cooler, out, log=lambda m: None)  # no runs yet: the data is simply made again
    assert made[-2:] == [("offline", 0.7), ("base", 1.0)]
    (out / "runs" / "grpo-offline-seed0").mkdir(parents=True)
    before = (out / "data" / "train_prompts.jsonl").read_text()
    fewer = ReproduceSettings(**{**plain.__dict__, "data_temperature": 0.7, "train_prompts": 10})
    for settings in (plain, fewer):
        with pytest.raises(UserError, match=r"offline\.json was made with other settings.*grpo-offline-seed0.*"
                                            r"another --output-dir"):
            D.prepare_data(settings, out, log=lambda m: None)
    assert (out / "data" / "train_prompts.jsonl").read_text() == before  # refused before rewriting anything
    with pytest.raises(UserError, match=r"--report: .*offline\.json was made with other settings"):
        D.prepare_data(plain, out, log=lambda m: None, make=False)
    assert len(made) == 4


def test_the_offline_data_is_sampled_only_when_a_regime_trains_on_it(tmp_path, monkeypatch):
    """Online and sparse regimes alone: the base's pass@1 only. An offline regime later in the same folder:
    the data, and the base measured again with the data's quality proxy; then online alone reads both back."""
    made: list = []
    D = _fake_data_steps(monkeypatch, made)
    small = dict(model="tiny", train_prompts=12, eval_prompts=4, offline_prompts=4)
    online = ReproduceSettings(**small, regimes=["online", "sparse8", "sparse8+humanline-kauto"])
    data = D.prepare_data(online, tmp_path, log=lambda m: None)
    assert made == [("base without quality", 1.0)] and data["offline"] is None
    assert not (tmp_path / "data" / "offline_groups.jsonl").exists()
    D.prepare_data(online, tmp_path, log=lambda m: None)  # cached
    D.prepare_data(ReproduceSettings(**small, regimes=["offline", "online"]), tmp_path, log=lambda m: None)
    assert made[1:] == [("offline", 1.0), ("base", 1.0)]
    again = D.prepare_data(online, tmp_path, log=lambda m: None)
    assert len(made) == 3 and again["offline"] is not None and "quality" in again["base"]


@pytest.mark.parametrize("value", [0.0, -1.0, 101.0])
def test_a_bad_data_temperature_names_the_flag(value):
    with pytest.raises(UserError, match="--data-temperature"):
        ReproduceSettings(data_temperature=value).check()


def test_the_command_refuses_a_bad_data_temperature_before_any_work(tmp_path, capsys):
    from helpers_reliability import run_cli

    code, lines = run_cli(["reproduce", "smollm2", "--data-temperature", "nan", "--output-dir", str(tmp_path / "o")],
                          capsys)
    assert code != 0 and any("--data-temperature: expected a number in (0, 100]" in line for line in lines), lines
    assert not (tmp_path / "o").exists()


def test_empty_completions_leave_the_offline_data_and_a_group_of_one_is_not_kept():
    """The sampler can stop at once; an empty completion cannot be trained on nor scored by `inspect data`."""
    from humanline.experiments.reproduce.data import without_empty

    group = {"id": "g", "prompt": "p", "completions": ["\\boxed{3}", "", " ", "no"], "scores": [1.0, 0.0, 0.0, 0.0],
             "answer": "3"}
    assert without_empty(group) == {**group, "completions": ["\\boxed{3}", "no"], "scores": [1.0, 0.0]}
    assert without_empty({**group, "completions": ["\\boxed{3}", "", "", ""]})["scores"] == [1.0]


def test_the_table_states_a_zero_standard_error_and_none_at_all():
    """A standard error of 0 (every answer alike) is a measurement; with none the table says so (it used to stop
    on an empty mean)."""
    assert res._mean_stderr([{"eval_se": 0.0}, {"eval_se": 0.02}]) == "~0.010"
    assert res._mean_stderr([{"eval_se": None}, {"eval_se": math.nan}]) == "not measured"


def test_dpo_rows_show_their_peak_and_mechanism_and_meet_the_paper_online_baseline():
    """Offline DPO peaks at step 10 (0.5, mean of 0.5 and 0.5) then falls to 0.3; rounds8 is the paper's online:
    every other row is paired with it (offline - rounds8: 0.3 - 0.6 and 0.3 - 0.5 -> -0.25 ± 0.05)."""
    def run(regime, seed, curve, **mechanism):
        return {**_run(regime, seed, curve, [10, 20]), "objective": "dpo", **mechanism}
    runs = [run("offline", 0, [0.5, 0.3], pair_weight=0.31, drift=0.4), run("offline", 1, [0.5, 0.3], pair_weight=0.29,
                                                                             drift=0.4),
            run("online", 0, [0.4, 0.5]), run("online", 1, [0.4, 0.5]),
            run("rounds8", 0, [0.4, 0.6]), run("rounds8", 1, [0.4, 0.5])]
    rows = res.aggregate({"runs": runs, "data": {"offline": None}})
    lines = res.preference_table(rows)
    assert "| dpo | offline | 0.300 | 0.500 (10) | 0.300 | — | 0.400 | — |" in lines
    assert [(a["regime"], b["regime"]) for a, b in res.comparisons(rows)] == [("offline", "rounds8"),
                                                                              ("online", "rounds8")]
    assert "| dpo | offline | rounds8 | -0.250 ± 0.050 | 2 | -5.0 |" in res.comparison_table(rows)
    assert res.preference_table([r for r in rows if r["objective"] == "grpo"]) == []


def test_a_run_that_peaked_and_fell_is_named_and_one_within_noise_is_not():
    """Seed 0 peaks at 0.9 (step 20) and ends at 0.5: 0.4 against a combined error of 0.028 (two evaluations of
    se 0.02), named; seed 1 ends 0.03 under its best (1.1 se), and a rising run, are not."""
    runs = [_run("stale64+humanline", 0, [0.6, 0.9, 0.5], [1, 2, 3]),
            _run("stale64+humanline", 1, [0.6, 0.9, 0.87], [1, 2, 3]),
            _run("online", 0, [0.3, 0.6, 0.8], [1, 2, 3])]
    rows = res.aggregate({"runs": runs, "data": {"offline": None}})
    lines = fallen_table(rows)
    assert lines[1:] == ["- grpo stale64+humanline seed 0: 0.900 at step 20, 0.500 at step 30 (-0.400, 14.1 se)"]
    assert "peaked and fell" in lines[0]
    assert fallen_table([r for r in rows if r["regime"] == "online"]) == []
    assert fell({"curve": [{"step": 8, "pass@1": 0.5}]}) is None
