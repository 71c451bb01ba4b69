"""The demo pipeline end to end at a toy size: policies, offline data, every regime, table, files, plots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from humanline.errors import UserError
from humanline.experiments.demo.policies import BaseConfig
from humanline.experiments.demo.results import write_outputs
from humanline.experiments.demo.run import DemoSettings, run_all


def test_demo_pipeline_writes_results_report_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / "cache"))
    settings = DemoSettings(
        objectives=["grpo"], regimes=["offline", "offline+humanline", "online", "sparse+humanline"],
        seeds=1, steps=2, prompts_per_step=4, samples_per_prompt=4, sample_every=2, eval_every=1,
        eval_prompts=8, eval_samples=1, train_prompts=64,
        base=BaseConfig(steps=3, hidden_size=32, num_layers=1, batch_size=8),
    )
    out = tmp_path / "demo"
    results = run_all(settings, out, log=lambda m: None)
    text = write_outputs(results, out, elapsed=1.0)
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["runs"]) == 4
    regimes = {(r["objective"], r["regime"]) for r in saved["summary"]}
    assert ("grpo", "sparse+humanline") in regimes and ("grpo", "online") in regimes
    for run in saved["runs"]:
        assert [p["step"] for p in run["curve"]] == [1, 2]
        assert 0.0 <= run["final_reward"] <= 1.0
    online = [r for r in saved["runs"] if r["regime"] == "online"]
    offline = [r for r in saved["runs"] if r["regime"] == "offline"]
    assert all(r["samples_generated"] > 0 for r in online)
    assert all(r["samples_generated"] == 0 for r in offline)
    assert "| grpo | online |" in text
    assert (out / "reward_grpo.png").exists()
    assert "## What this shows" in (out / "report.md").read_text()


def test_demo_run_configs_validate_for_every_objective_and_regime(tmp_path):
    from humanline.experiments.demo.run import OBJECTIVES, run_config
    from humanline.experiments.harness.regimes import ABLATION, REGIMES

    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}
    for objective in OBJECTIVES:
        for regime in (*REGIMES, *ABLATION):
            cfg = run_config(DemoSettings(), data, objective, regime, 0, tmp_path)
            assert cfg.objective.name == objective
            assert cfg.humanline.enabled == ("+" in regime)
            assert cfg.train.regime == regime.split("+")[0]


def test_the_demo_offers_the_objectives_it_has_settings_for():
    """`humanline demo --objective` offers the objectives with demo settings, each an entry of `SPECS` (an
    objective of the table without them trains everywhere else; the demo leaves it out)."""
    from humanline.commands.demo import add_parser
    from humanline.experiments.demo.run import OBJECTIVES
    from humanline.training.objective_table import SPECS

    assert set(OBJECTIVES) <= set(SPECS)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    for name in OBJECTIVES:
        assert parser.parse_args(["demo", "--objective", name]).objective == name


def test_regime_names_set_the_humanline_variant(tmp_path):
    """Each part of the ablation is what its name says, on top of the objective's own k and band."""
    from humanline.experiments.demo.run import OBJECTIVES, run_config
    from humanline.experiments.harness.regimes import NO_SYNC

    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}

    def h(regime, objective="dpo"):
        return run_config(DemoSettings(), data, objective, regime, 0, tmp_path).humanline

    default = OBJECTIVES["dpo"]["humanline"]
    both = h("offline+humanline")
    assert (both.transform, both.sync_every, both.low, both.high, both.band) == (
        "clip", default["sync_every"], default["low"], default["high"], "fixed")
    assert h("offline+sync-only").transform == "none" and h("offline+sync-only").sync_every == default["sync_every"]
    assert h("offline+clip-only").sync_every == NO_SYNC and h("offline+clip-only").transform == "clip"
    assert h("offline+reject").transform == "reject"
    assert h("offline+humanline-k16").sync_every == 16
    auto = h("offline+humanline-auto")
    assert (auto.band, auto.low, auto.high, auto.band_quantiles) == ("auto", -1.5, 1.5, [0.1, 0.99])
    assert h("offline+humanline-auto0.1,0.95").band_quantiles == [0.1, 0.95]
    banded = h("offline+humanline-k2-band-0.3,0.25")
    assert (banded.sync_every, banded.low, banded.high) == (2, -0.3, 0.25)
    # -band names a fixed band even where the objective's own band is auto (reproduce's KTO)
    from humanline.experiments.harness.regimes import regime_overrides
    from humanline.experiments.reproduce.settings import OBJECTIVES as REPRODUCE

    assert REPRODUCE["kto"]["config"]["humanline"]["band"] == "auto"
    assert regime_overrides("offline+humanline-k1-band-1.5,1.5")["humanline"]["band"] == "fixed"


def test_a_run_whose_config_cannot_load_stops_the_demo_before_anything_is_made(tmp_path):
    """A regime that reads but cannot load for its objective (a GRPO-only correction under DPO) fails before the
    offline data is sampled or the output folder made."""
    settings = DemoSettings(objectives=["dpo"], regimes=["offline", "stale4+tis"])
    with pytest.raises(UserError, match=r"--regimes: 'stale4\+tis'.*objective.correction"):
        run_all(settings, tmp_path / "out", print)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["nowhere", "offline+humanlin", "offline+humanline-k", "offline+humanline-x3",
                                  "offline+humanline-band0.1,0.2", "offline+reject-auto"])
def test_malformed_regime_names_are_one_line_errors(name):
    """A name that cannot be read fails in `--regimes`; one that reads but gives an invalid config (a band
    with low > 0, the auto band without the clip) fails when its config loads; both as one line."""
    from humanline.experiments.demo.run import run_config

    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}
    with pytest.raises(UserError) as info:
        run_config(DemoSettings(), data, "dpo", name, 0, "x")
    assert "\n" not in str(info.value) and ("--regimes" in str(info.value) or "humanline." in str(info.value))


def test_ablation_plan_covers_every_part_once_per_objective():
    """9 regimes per objective: k equal to the objective's default is its offline+humanline row, not repeated."""
    settings = DemoSettings(ablation=True, objectives=["dpo", "grpo", "kto"])
    plan = settings.plan()
    assert len(plan) == 27
    grpo = [r for o, r in plan if o == "grpo"]
    assert "offline+humanline-k1" not in grpo and {"offline+humanline-k4", "offline+humanline-k16"} <= set(grpo)
    dpo = [r for o, r in plan if o == "dpo"]
    assert "offline+humanline-k4" not in dpo and "offline+humanline-k1" in dpo
    assert {"offline+sync-only", "offline+clip-only", "offline+reject", "offline+humanline-auto"} <= set(dpo)


def _toy_settings(**changes) -> DemoSettings:
    settings = DemoSettings(
        objectives=["grpo"], regimes=["offline+humanline", "online"], seeds=1, steps=3, prompts_per_step=4,
        samples_per_prompt=4, eval_every=3, eval_prompts=8, eval_samples=1, train_prompts=64,
        base=BaseConfig(steps=20),  # the default model size: big enough that 2 threads split its matmuls
    )
    for name, value in changes.items():
        setattr(settings, name, value)
    return settings


def _untimed_metrics(run_dir: str | Path) -> list[dict]:
    """Every metrics line of a run without its clock readings (what must not depend on the worker count)."""
    clock = ("time/", "elapsed_s", "tokens_per_s", "cost/cpu_seconds", "eval/seconds")
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not any(c in k for c in clock)} for line in lines]


def test_results_do_not_depend_on_the_number_of_workers(tmp_path, monkeypatch):
    """Side by side in worker processes, the two SFTs give the same bytes and the runs the same metrics (every
    one but the clock's) as one after the other in this process: every demo computation runs on one thread."""
    import torch

    results, before = {}, torch.get_num_threads()
    torch.set_num_threads(2)  # as in a user's process (the suite pins 1): the demo must pin its own threads
    try:
        for workers in (1, 2):
            monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / f"cache{workers}"))
            results[workers] = run_all(_toy_settings(workers=workers), tmp_path / f"w{workers}", log=lambda m: None)
    finally:
        torch.set_num_threads(before)
    serial, parallel = results[1], results[2]
    for name in ("base", "weak"):
        files = [Path(r["data"]["base"]).parent / name / "model.safetensors" for r in (serial, parallel)]
        assert files[0].read_bytes() == files[1].read_bytes()
    assert Path(serial["data"]["groups"]).read_text() == Path(parallel["data"]["groups"]).read_text()
    assert [(r["regime"], r["seed"]) for r in parallel["runs"]] == [(r["regime"], r["seed"]) for r in serial["runs"]]
    for one, two in zip(serial["runs"], parallel["runs"]):
        assert one["run_dir"] == two["run_dir"] == f"runs/{Path(one['run_dir']).name}"  # relative to the output folder
        one_dir, two_dir = tmp_path / "w1" / one["run_dir"], tmp_path / "w2" / two["run_dir"]
        assert len(_untimed_metrics(one_dir)) >= 3
        assert _untimed_metrics(one_dir) == _untimed_metrics(two_dir)
        assert one["final_reward"] == two["final_reward"]


def test_a_failing_run_in_a_worker_reaches_the_caller(tmp_path, monkeypatch):
    """An error inside a worker process stops the demo with that error (here: an offline dataset that is empty)."""
    from humanline.experiments.demo import run as demo_run

    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / "cache"))
    prepare = demo_run.prepare_data

    def empty_groups(settings, out, log):
        data = prepare(settings, out, log)
        open(data["groups"], "w").close()
        return data

    monkeypatch.setattr(demo_run, "prepare_data", empty_groups)
    with pytest.raises(UserError, match="no records"):
        run_all(_toy_settings(workers=2), tmp_path / "demo", log=lambda m: None)


def test_one_thread_restores_the_setting_and_workers_flag_is_checked():
    import torch

    from humanline.cli import main
    from humanline.experiments.harness.workers import MAX_WORKERS, default_workers, one_thread

    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    assert 1 <= default_workers() <= MAX_WORKERS
    assert main(["demo", "--workers", "0", "--output-dir", "unused"]) == 2


def _die(code: int) -> None:
    import os

    os._exit(code)  # a worker killed from outside (out of memory) ends like this: no exception, no result


def test_a_worker_that_dies_is_a_one_line_error():
    from humanline.experiments.harness.workers import run_jobs

    with pytest.raises(UserError, match="worker process of the demo stopped abruptly.*fewer --workers"):
        run_jobs(_die, [(1,), (1,)], workers=2)


def test_one_worker_starts_no_job_after_one_a_signal_stopped():
    """In one process the signal reaches the job's Trainer, which saves and returns: the job's result says so
    (`stopped_by`), no later job starts (two processes would otherwise train into one folder once the command is
    run again), and the call exits as the signal would have ended it."""
    from humanline.experiments.harness.workers import run_jobs

    calls = []

    def job(i):
        calls.append(i)
        return {"stopped": i == 1, "signal": 15}

    with pytest.raises(SystemExit) as exit_info:
        run_jobs(job, [(0,), (1,), (2,)], workers=1,
                 stopped_by=lambda r: r["signal"] if r["stopped"] else None)
    assert exit_info.value.code == 143 and calls == [0, 1]
    assert run_jobs(job, [(0,), (2,)], workers=1, stopped_by=lambda r: None) == [{"stopped": False, "signal": 15}] * 2


def _wait_for_sigterm(folder: str, i: int) -> int:
    """A job that runs until SIGTERM, as a Trainer does (it then saves a checkpoint and returns)."""
    import os
    import signal
    import time

    got = []
    signal.signal(signal.SIGTERM, lambda *_: got.append(1))
    (Path(folder) / f"started-{i}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    (Path(folder) / f"{'stopped' if got else 'timed-out'}-{i}").write_text("")
    return i


def test_sigterm_to_the_parent_stops_its_workers_and_starts_no_new_job(tmp_path):
    """`kill` of a demo / reproduce process used to leave its workers training on, orphaned, into run folders a
    restarted command then trained too. Now the running jobs get SIGTERM, no queued job starts, exit 143."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from humanline.experiments.harness.workers import run_jobs\n"
        "from test_demo_run import _wait_for_sigterm\n"
        "if __name__ == '__main__':\n"
        f"    run_jobs(_wait_for_sigterm, [({str(tmp_path)!r}, i) for i in range(3)], workers=2)\n"
        "    print('returned')\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.05)
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0", "started-1"], parent.poll()
    parent.send_signal(signal.SIGTERM)
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 128 + signal.SIGTERM, err
    assert "returned" not in out
    assert "SIGTERM: the running jobs stopped (a run keeps its checkpoint), 1 of 3 did not start" in err
    assert (tmp_path / "stopped-0").exists() and (tmp_path / "stopped-1").exists()
    assert not (tmp_path / "started-2").exists()  # the queued job never started
    for i in (0, 1):  # and no worker outlived the parent
        pid = int((tmp_path / f"started-{i}").read_text())
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_cpu_quota_reads_both_cgroup_versions(tmp_path):
    from humanline.experiments.harness.workers import cpu_quota

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert cpu_quota(str(v2)) == 2  # 2.5 cores of quota: 2 whole workers
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(str(v2)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(str(v1)) == 1  # half a core still gets one worker
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(str(v1)) is None
    assert cpu_quota(str(tmp_path / "none")) is None


def test_verdict_measures_a_match_against_onlines_spread():
    """0.624 +- 0.033 vs online 0.650 +- 0.010 closes 76% of the gap (it does not 'match' through its own wide
    std); 0.645 does match; 0.545 does not improve on offline 0.541."""
    from humanline.experiments.demo.results import verdict

    def row(regime, mean, std):
        return {"objective": "dpo", "regime": regime, "reward_mean": mean, "reward_std": std,
                "speedup_vs_online": None}

    rows = [row("offline", 0.541, 0.037), row("online", 0.650, 0.010), row("sparse+humanline", 0.624, 0.033),
            row("offline+humanline", 0.645, 0.002), row("offline+sync-only", 0.545, 0.01)]
    lines = verdict(rows)
    assert "dpo: sparse+humanline closes 76% of the offline-online gap" in lines[0]
    assert "dpo: offline+humanline matches online (within online's seed std)" in lines[1]
    assert "dpo: offline+sync-only does not improve on offline" in lines[2]
    assert verdict([row("offline", 0.5, 0.0), row("online", 0.505, 0.0)])[0].startswith(
        "dpo: online did not beat offline here")


def test_offline_source_base_samples_the_policy_being_aligned(tmp_path, monkeypatch):
    """`offline_source="base"` (`--offline-source base`): the offline groups are what the base policy samples
    (compared with sampling it directly, same seed), not the weak policy's; the report names the source."""
    from humanline.experiments.demo.offline import write_offline_groups
    from humanline.experiments.demo.policies import ensure_policies, load_policy
    from humanline.experiments.demo.run import drop_empty_completions, prepare_data
    from humanline.experiments.demo.tasks import make_task

    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / "cache"))
    base_cfg = BaseConfig(steps=3, hidden_size=32, num_layers=1, batch_size=8)
    groups = {}
    for source in ("weak", "base"):
        settings = DemoSettings(samples_per_prompt=4, eval_prompts=8, eval_samples=1, train_prompts=32,
                                base=base_cfg, offline_source=source)
        data = prepare_data(settings, tmp_path / source, log=lambda m: None)
        assert data["offline_source"] == source
        groups[source] = Path(data["groups"]).read_text()
    policies = ensure_policies(base_cfg, log=lambda m: None)
    task = make_task(base_cfg.task, seed=base_cfg.task_seed)
    model, tokenizer = load_policy(policies.base)
    direct = tmp_path / "direct.jsonl"
    write_offline_groups(model, tokenizer, task, direct, n=4, seed=1, records=task.train[:32])
    drop_empty_completions(direct)
    assert groups["base"] == direct.read_text() != groups["weak"]
    results = {"settings": {}, "data": data, "runs": []}
    assert "from the base policy itself" in _report_intro(results, tmp_path / "report")


def _report_intro(results: dict, out: Path) -> str:
    out.mkdir()
    write_outputs(results, out, elapsed=0.0)
    return (out / "report.md").read_text()


def test_gap_closed_is_shown_only_where_online_beat_offline():
    """Online 0.60 over offline 0.40: humanline's 0.55 closes (0.55 - 0.40) / (0.60 - 0.40) = 75%. Online 0.30
    under offline 0.40: no share (it would print -0% and -33%), the cell says why."""
    from humanline.experiments.demo.results import aggregate, table

    def run(regime, reward):
        return {"objective": "grpo", "regime": regime, "seed": 0, "final_reward": reward, "inside_band": None}

    def cells(online):
        runs = [run("offline", 0.40), run("online", online), run("offline+humanline", 0.55)]
        rows = aggregate({"runs": runs})
        return [r["gap_closed"] for r in rows], table(rows, 0.1)

    shares, text = cells(0.60)
    assert shares == pytest.approx([0.0, 1.0, 0.75]) and "| 75% |" in text
    shares, text = cells(0.30)
    assert shares == [None, None, None]
    assert text.count("| n/a (online did not beat offline) |") == 3 and "-0%" not in text and "-33%" not in text


@pytest.mark.parametrize("name, nll, correction, humanline", [
    ("offline+nll0.1", 0.1, None, None),
    ("online+nll1e-2", 0.01, None, None),
    ("sparse8+humanline-nll0.25", 0.25, None, True),
    ("stale4+humanline-tis", None, "tis", True),
    ("stale16+vespo", None, "vespo", None),
    ("stale4+humanline-geo_mask", None, "geo_mask", True),
])
def test_the_nll_anchor_and_the_new_corrections_in_regime_names(name, nll, correction, humanline):
    from humanline.experiments.harness.regimes import regime_overrides

    got = regime_overrides(name)
    assert got.get("objective", {}).get("nll_weight") == nll
    assert got.get("objective", {}).get("correction") == correction
    assert got.get("humanline", {}).get("enabled") == humanline


@pytest.mark.parametrize("name, fragment", [("offline+nll0", "W > 0"), ("offline+nll", "expected offline+"),
                                            ("offline+humanline-nll-1", "cannot read the options")])
def test_a_bad_nll_weight_in_a_regime_name_is_one_line(name, fragment):
    from humanline.experiments.harness.regimes import regime_overrides

    with pytest.raises(UserError, match=fragment):
        regime_overrides(name)
