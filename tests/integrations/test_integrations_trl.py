"""humanline.integrations.trl: TRL's DPO/KTO/GRPO trainers made humanline, against our Trainer.

Parity (the claim of docs/trl.md): on the same micro-batches, TRL + `make_humanline` and our `Trainer` give
the same loss for every micro-batch, the same clipped gradients before every update and the same weights
after the run, at k = 1 and k = 4, with TRL's model-based and precomputed reference, with gradient
accumulation, for DPO, KTO and GRPO on fixed completions. Our side is float64 throughout; TRL's fused
log-prob head computes its softmax in float32 whatever the weights' dtype, hence the 1e-5 tolerances.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("trl", reason="the TRL integration needs trl (pip install 'humanline[trl]')")

import helpers_trl as H  # noqa: E402
from humanline.integrations.trl import HumanlineArgs, make_humanline  # noqa: E402


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """Both sides run on the CPU whatever the test device: parity is float64 arithmetic, and TRL's side is pinned
    to the CPU (`use_cpu=True`) so that its numbers do not depend on a GPU's kernels. (accelerate's process-wide
    state, which TRL's TrainingArguments and our Trainer set up differently, is cleared after every test by
    conftest.)"""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")


# (objective, k, grad_accum, TRL reference, steps): k = 4 runs past a second sync (steps 5.. use theta_4)
CASES = [
    ("dpo", 1, 1, "model", 4),
    ("dpo", 4, 2, "precompute", 6),
    ("kto", 1, 2, "model", 4),
    ("kto", 4, 1, "precompute", 6),
    ("grpo", 1, 1, "model", 4),
    ("grpo", 4, 2, "model", 6),
    ("dpo", 2, 1, "peft", 4),  # LoRA: TRL's adapter copy vs our lookahead through the adapters
    ("dpo", "auto", 1, "model", 6),  # the drift rule: the same windows chosen on both sides
    ("kto", "auto", 1, "model", 6),
    ("grpo", "auto", 2, "model", 6),
]


def _parity(tmp_path, objective, k, ga, reference, steps, *, mb=2, grpo_beta=0.01):
    ours = H.ours(objective, tmp_path / "ours", k=k, steps=steps, mb=mb, ga=ga, grpo_beta=grpo_beta,
                  lora=reference == "peft")
    init = H.copy.deepcopy(ours.run.unwrapped)
    batches = [b for s in range(steps) for b in ours.run.schedule(s)]
    mine = H.run_ours(ours, steps)
    trl = H.trl_trainer(objective, init, ours.run.tokenizer, tmp_path / "trl", mb=mb, ga=ga, steps=steps,
                        reference=reference, grpo_beta=grpo_beta)
    make_humanline(trl, HumanlineArgs(**H.sync_settings(k, H.trust_width(objective, *H.BAND, 0.01)), low=H.BAND[0],
                                      high=H.BAND[1]))
    theirs = H.run_trl(trl, objective, batches)
    return init, ours, mine, trl, theirs


def _norm(tensors: dict) -> float:
    return math.sqrt(sum(float(t.double().norm()) ** 2 for t in tensors.values()))


def _assert_same(init, ours, mine, trl, theirs, steps, ga):
    """Losses per micro-batch; gradients per step (norm of the difference vs norm of ours, with a floor for
    steps where every token is outside the band and both gradients are ~0); weights after the run (norm of
    the difference vs how far training moved them: Adam amplifies float32-level differences of ~1e-9
    gradients into ~1e-4 of one update on those few weights, so an elementwise bound would say little)."""
    assert len(mine.losses) == len(theirs.losses) == steps * ga
    assert theirs.losses == pytest.approx(mine.losses, rel=1e-5, abs=1e-6)
    assert len(mine.grads) == len(theirs.grads) == steps
    for step, (g_ours, g_trl) in enumerate(zip(mine.grads, theirs.grads)):
        assert g_ours.keys() == g_trl.keys()
        diff = _norm({n: g_trl[n] - g_ours[n] for n in g_ours})
        assert diff <= 1e-5 * _norm(g_ours) + 1e-7, f"step {step}: gradient differs by {diff:.3g}"
    start = dict(init.named_parameters())
    final = dict(trl.model.named_parameters())
    ours_final = dict(ours.run.unwrapped.named_parameters())
    moved = _norm({n: p.detach() - start[n].detach() for n, p in ours_final.items()})
    diff = _norm({n: final[n].detach() - p.detach() for n, p in ours_final.items()})
    assert diff <= 1e-4 * moved, f"weights differ by {diff:.3g} after moving {moved:.3g}"
    assert theirs.inside == pytest.approx(mine.inside, abs=1e-9)
    assert min(mine.inside) < 1.0, "the band never clipped: the test would not exercise the transform"
    # every humanline metric, same names and values in both paths (token-weighted over micro-batches; float32
    # summation order differs: our forward runs a shared prompt once, TRL per row)
    assert [sorted(m) for m in theirs.metrics] == [sorted(m) for m in mine.metrics]
    for step, (m_ours, m_trl) in enumerate(zip(mine.metrics, theirs.metrics)):
        assert m_trl == pytest.approx(m_ours, rel=1e-5, abs=1e-5), f"step {step}"


@pytest.mark.parametrize("objective,k,ga,reference,steps", CASES)
def test_trl_matches_our_trainer(tmp_path, objective, k, ga, reference, steps):
    init, ours, mine, trl, theirs = _parity(tmp_path, objective, k, ga, reference, steps)
    _assert_same(init, ours, mine, trl, theirs, steps, ga)
    rule = ours.run.humanline.rule
    assert trl.humanline.sync.syncs == rule.count_through(steps - 1)
    assert [trl.humanline.humanline.rule.at(s) for s in range(steps)] == [rule.at(s) for s in range(steps)]
    if k == "auto":  # the case must exercise windows of more than one step
        assert 1 < rule.count_through(steps - 1) < steps, rule.syncs
    if reference == "peft":
        from humanline.integrations.trl import REFERENCE_ADAPTER

        trained = [n for n, p in trl.model.named_parameters() if p.requires_grad]
        assert trained and all(".default." in n for n in trained)  # the reference adapter is never trained
        assert any(f".{REFERENCE_ADAPTER}." in n for n, _ in trl.model.named_parameters())



# ---------------------------------------------------------------------------- TRL's own pipeline


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
def test_runs_on_trls_own_pipeline_and_logs_the_band(tmp_path, objective):
    """End to end on TRL's tokenisation, collation (KTO: TRL's mismatched pairs) and, for GRPO, generation."""
    trainer = H.own_pipeline(objective, tmp_path, steps=3)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    make_humanline(trainer, HumanlineArgs(sync_every=2))
    trainer.train()
    assert H.logged(trainer, "humanline/inside_band")[0] == 1.0  # step 0: reference == policy, ratios 1
    assert H.logged(trainer, "humanline/log_ratio_mean")[0] == 0.0
    # syncs before updates 0 and 2, each counted in its own step's log (finding 3: it used to read one behind)
    assert H.logged(trainer, "humanline/syncs") == [1.0, 1.0, 2.0]
    assert H.logged(trainer, "humanline/steps_since_sync") == [0.0, 1.0, 2.0]
    assert all(math.isfinite(x) for x in H.logged(trainer, "loss"))
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def _train_with_snapshots(trainer) -> tuple[list, list]:
    """Train `trainer`, copying the policy's and the humanline reference's weights at the start of every step."""
    from transformers import TrainerCallback

    reference = trainer.humanline.reference
    policy_at, reference_at = [], []

    class Snapshot(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            policy_at.append([p.detach().clone() for p in trainer.model.parameters()])
            reference_at.append([p.detach().clone() for p in reference.model.parameters()])

    trainer.add_callback(Snapshot())
    trainer.train()
    return policy_at, reference_at


@pytest.mark.parametrize("k", [1, 3])
def test_reference_holds_the_pre_update_weights_of_the_last_sync(tmp_path, k):
    """docs/method.md §3.2: the reference used at step s >= 1 holds theta_j, j = the last multiple of k below s (k = 1:
    theta_{s-1}); at step 0 it holds theta_0."""
    trainer = make_humanline(H.own_pipeline("dpo", tmp_path, steps=6), HumanlineArgs(sync_every=k))
    policy_at, reference_at = _train_with_snapshots(trainer)
    for s in range(6):
        j = 0 if s == 0 else (s - 1) - (s - 1) % k
        assert all(torch.equal(r, p) for r, p in zip(reference_at[s], policy_at[j])), f"step {s}"
    assert not all(torch.equal(r, p) for r, p in zip(reference_at[5], policy_at[5]))


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
def test_drift_rule_on_trls_own_pipeline(tmp_path, objective):
    """`sync_every: auto` through TRL's own data path: the reference used at step s holds theta_j, j the last sync
    the drift rule chose before s, and the rule chose windows of more than one step."""
    trainer = make_humanline(H.own_pipeline(objective, tmp_path, steps=6),
                             HumanlineArgs(**H.sync_settings("auto", H.trust_width(objective, -1.5, 1.5, 0.2))))
    policy_at, reference_at = _train_with_snapshots(trainer)
    rule = trainer.humanline.humanline.rule
    assert 1 < rule.count_through(5) < 6, rule.syncs
    for s in range(6):
        j = rule.last_before(s) or 0
        assert all(torch.equal(r, p) for r, p in zip(reference_at[s], policy_at[j])), f"step {s}"
    assert H.logged(trainer, "humanline/sync_period")[:1] == [1.0]
    assert all(x >= 0 for x in H.logged(trainer, "humanline/drift"))


def test_trls_plain_sync_at_k1_gives_ratio_one(tmp_path):
    """TRL's own syncing (`sync_ref_model`, mix-up alpha 1, every step) copies after the update: from step 1 on
    the reference *is* the policy, every ratio is exactly 1, every implicit reward exactly 0 and the DPO loss
    exactly log 2, so clipping could never act. The integration's pre-update sync at k = 1 does not."""
    plain = H.own_pipeline("dpo", tmp_path / "plain", steps=4, sync_ref_model=True, ref_model_mixup_alpha=1.0,
                           ref_model_sync_steps=1)
    plain.train()
    assert H.logged(plain, "rewards/chosen")[1:] == [0.0, 0.0, 0.0]
    assert H.logged(plain, "rewards/rejected")[1:] == [0.0, 0.0, 0.0]
    assert H.logged(plain, "loss")[1:] == [pytest.approx(math.log(2), abs=1e-7)] * 3
    humanline = make_humanline(H.own_pipeline("dpo", tmp_path / "hl", steps=4), HumanlineArgs(sync_every=1))
    humanline.train()
    assert all(r != 0.0 for r in H.logged(humanline, "rewards/chosen")[1:])
    assert all(x != 0.0 for x in H.logged(humanline, "humanline/log_ratio_mean")[1:])


# ---------------------------------------------------------------------------- the guard


def test_a_trl_outside_the_supported_range_is_refused_by_name(tmp_path, monkeypatch):
    import trl

    from humanline.integrations.trl import SUPPORTED_TRL, HumanlineTRLError

    trainer = H.own_pipeline("dpo", tmp_path, steps=1)
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(HumanlineTRLError, match=rf"TRL {SUPPORTED_TRL} \(installed: 1.17.0\)"):
        make_humanline(trainer)
    with pytest.warns(UserWarning, match="outside the tested range"):
        make_humanline(trainer, HumanlineArgs(allow_untested_trl=True))
    trainer.train()  # the per-call checks pass on this (1.16) implementation


def test_a_loss_that_bypasses_the_reference_fails_loudly(tmp_path):
    """Simulated internals change: TRL's DPO loss reads precomputed sums instead of running its reference."""
    from humanline.integrations.trl import HumanlineTRLError

    trainer = make_humanline(H.own_pipeline("dpo", tmp_path, steps=1))

    def loss_without_reference(model, inputs, return_outputs=False):
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels,
                    fused_lm_head=True)
        return -out.log_probs.sum()

    trainer._compute_loss = loss_without_reference
    with pytest.raises(HumanlineTRLError, match="did not run its reference forward"):
        trainer.train()


def test_a_loss_that_never_asks_for_log_probs_fails_loudly(tmp_path):
    from humanline.integrations.trl import HumanlineTRLError

    trainer = make_humanline(H.own_pipeline("kto", tmp_path, steps=1))
    trainer._compute_loss = lambda model, inputs, return_outputs=False: (
        model(input_ids=inputs["input_ids"]).logits.mean())
    with pytest.raises(HumanlineTRLError, match="no policy forward with fused_lm_head"):
        trainer.train()


def test_grpo_reading_the_old_log_probs_before_the_forward_fails_loudly(tmp_path):
    from humanline.integrations.trl import HumanlineTRLError

    trainer = make_humanline(H.own_pipeline("grpo", tmp_path, steps=1))
    real = trainer._compute_loss

    def early_reader(model, inputs):
        inputs.get("old_per_token_logps")
        return real(model, inputs)

    trainer._compute_loss = early_reader
    with pytest.raises(HumanlineTRLError, match="read old_per_token_logps before the policy forward"):
        trainer.train()


def test_missing_internals_are_named(tmp_path, monkeypatch):
    from trl import DPOTrainer

    from humanline.integrations.trl import HumanlineTRLError

    trainer = H.own_pipeline("dpo", tmp_path, steps=1)
    monkeypatch.delattr(DPOTrainer, "_compute_loss")
    with pytest.raises(HumanlineTRLError,
                       match=r"has no _compute_loss.*supports TRL|supports TRL.*has no _compute_loss"):
        make_humanline(trainer)


@pytest.mark.parametrize("objective,config,message", [
    ("dpo", {"sync_ref_model": True}, "sync_ref_model=True"),
    ("dpo", {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 1.0]}, "'sft'"),
    ("grpo", {"loss_type": "cispo"}, "loss_type 'cispo' is not supported"),
])
def test_unsupported_configurations_are_refused(tmp_path, objective, config, message):
    trainer = H.own_pipeline(objective, tmp_path, steps=1, **config)
    with pytest.raises(ValueError, match=message):
        make_humanline(trainer)


def test_arguments_are_validated_and_only_trl_trainers_accepted():
    with pytest.raises(ValueError, match="low"):
        HumanlineArgs(low=0.5)
    with pytest.raises(ValueError, match="sync_every"):
        HumanlineArgs(sync_every=0)
    with pytest.raises(ValueError, match="transform"):
        HumanlineArgs(transform="mix")
    with pytest.raises(TypeError, match="DPOTrainer, KTOTrainer and GRPOTrainer"):
        make_humanline(object())


# ---------------------------------------------------------------------------- stochastic rejection


def test_reject_transform_is_seeded_and_differs_from_clip(tmp_path):
    """transform="reject" (docs/method.md §3.3) through TRL: same seed, same weights; another seed, other weights."""
    finals = {}
    runs = {"a": HumanlineArgs(transform="reject", seed=1), "b": HumanlineArgs(transform="reject", seed=1),
            "c": HumanlineArgs(transform="reject", seed=2), "clip": HumanlineArgs(low=-0.01, high=0.01)}
    for name, args in runs.items():
        trainer = make_humanline(H.own_pipeline("dpo", tmp_path / name, steps=3, learning_rate=5e-2), args)
        trainer.train()
        finals[name] = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    assert torch.equal(finals["a"], finals["b"])
    assert not torch.equal(finals["a"], finals["c"])
    assert not torch.equal(finals["a"], finals["clip"])


@pytest.mark.parametrize("objective", ["kto", "grpo"])
def test_peft_policy_from_trls_peft_config(tmp_path, objective):
    """TRL wraps the policy itself (peft_config), with its default gradient checkpointing on: the reference
    is an adapter copy, synced before each update, never trained; the trained adapter moves."""
    from peft import LoraConfig

    from humanline.integrations.trl import REFERENCE_ADAPTER

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = H.own_pipeline(objective, tmp_path, steps=2, peft_config=lora, gradient_checkpointing=True)
    make_humanline(trainer, HumanlineArgs(sync_every=1))
    trainer.train()
    params = dict(trainer.model.named_parameters())
    pairs = [(n, n.replace(".default.", f".{REFERENCE_ADAPTER}.")) for n in params if ".default." in n]
    assert pairs and all(params[n].requires_grad and not params[r].requires_grad for n, r in pairs)
    assert all(x != 0.0 for x in H.logged(trainer, "humanline/log_ratio_mean")[1:])  # step 1: theta_1 vs theta_0
    assert H.logged(trainer, "humanline/syncs") == [1.0, 2.0]


@pytest.mark.slow
def test_example_script_runs(tmp_path):
    """scripts/trl_humanline_example.py, as docs/trl.md tells users to run it (shortened); it cleans up after
    itself (it left four folders in the system temp dir per run)."""
    import os
    import subprocess
    import sys

    from helpers_train import ROOT

    scratch = tmp_path / "system-tmp"  # the script's temporary folders go here, and must be gone at the end
    scratch.mkdir()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "trl_humanline_example.py"), "--steps", "2"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "TMPDIR": str(scratch)})
    assert out.returncode == 0, out.stderr[-2000:]
    for objective in ("DPO", "KTO", "GRPO"):
        assert f"{objective} + humanline (k = 1" in out.stdout
    assert list(scratch.iterdir()) == [], "the example left folders in the system temp dir"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ddp", "fsdp"])
def test_two_processes_match_one(tmp_path, launcher):
    """DDP (torchrun) or FSDP2 (`accelerate launch --config_file recipes/accelerate/fsdp.yaml`, float32), gloo on
    the CPU: two processes with 2 pairs each train like one process with 4 (same global batches): the same
    losses, the same inside-band fractions (reduced across processes), the same weights. The band is narrow
    (BAND) and k = 1, so a sync that came after the update (every ratio 1), or a shard copied into the wrong
    place, would change the inside-band fractions from step 2 on."""
    import os
    import socket
    import subprocess
    import sys

    from helpers_train import ROOT

    results = {}
    for processes in (1, 2):
        out = tmp_path / f"p{processes}"
        out.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        worker = [str(ROOT / "tests" / "trl_ddp_worker.py"), str(out), "4"]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
               f"--master_port={port}", *worker]
        if launcher == "fsdp" and processes == 2:
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(ROOT / "recipes" / "accelerate" / "fsdp.yaml"), "--num_processes", "2", "--mixed_precision",
                   "no", "--main_process_port", str(port), *worker]
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        log = json.loads((out / "log.json").read_text())
        results[processes] = (torch.load(out / "init.pt"), torch.load(out / "final.pt"), log)
    assert (tmp_path / "p2" / "distributed_0.txt").read_text().endswith({"ddp": "MULTI_CPU", "fsdp": "FSDP"}[launcher])
    (init, w1, log1), (_, w2, log2) = results[1], results[2]
    for key in ("loss", "humanline/inside_band", "humanline/log_ratio_mean", "humanline/syncs"):
        one, two = [h[key] for h in log1 if key in h], [h[key] for h in log2 if key in h]
        assert len(one) == 3 and two == pytest.approx(one, rel=1e-5, abs=1e-6), key
    moved = _norm({n: w1[n] - init[n] for n in w1})  # the weights' criterion of _assert_same
    assert _norm({n: w2[n] - w1[n] for n in w1}) <= 1e-4 * moved


@pytest.mark.slow
def test_grpo_fsdp_matches_ddp(tmp_path):
    """TRL's GRPO + make_humanline (k = 1, band BAND, beta 0: humanline keeps its own reference, sharded under
    FSDP2) on two CPU processes: FSDP2 samples, scores and trains exactly as DDP does (each process samples its
    own prompts with TRL's per-process seed, so a one-process run would sample other completions)."""
    import os
    import socket
    import subprocess
    import sys

    from helpers_train import ROOT

    results = {}
    for launcher in ("ddp", "fsdp"):
        out = tmp_path / launcher
        out.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        worker = [str(ROOT / "tests" / "trl_ddp_worker.py"), str(out), "8", "grpo"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", *worker]
        if launcher == "fsdp":
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(ROOT / "recipes" / "accelerate" / "fsdp.yaml"), "--num_processes", "2", "--mixed_precision",
                   "no", "--main_process_port", str(port), *worker]
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (out / "distributed_0.txt").read_text().endswith({"ddp": "MULTI_CPU", "fsdp": "FSDP"}[launcher])
        results[launcher] = (torch.load(out / "init.pt"), torch.load(out / "final.pt"),
                             json.loads((out / "log.json").read_text()))
    (init, w_ddp, log_ddp), (_, w_fsdp, log_fsdp) = results["ddp"], results["fsdp"]
    assert [h["reward"] for h in log_fsdp if "reward" in h] == [h["reward"] for h in log_ddp if "reward" in h]
    for key in ("loss", "humanline/inside_band", "humanline/syncs"):
        ddp, fsdp = [h[key] for h in log_ddp if key in h], [h[key] for h in log_fsdp if key in h]
        assert len(ddp) == 3 and fsdp == pytest.approx(ddp, rel=1e-5, abs=1e-6), key
    assert min(h["humanline/inside_band"] for h in log_ddp if "loss" in h) < 1  # the band binds: syncs matter
    moved = _norm({n: w_ddp[n] - init[n] for n in w_ddp})
    assert _norm({n: w_fsdp[n] - w_ddp[n] for n in w_ddp}) <= 1e-4 * moved


@pytest.mark.parametrize("deepspeed, fsdp, fsdp2, refused", [
    (True, False, False, "not DeepSpeed"),
    (False, True, False, "not FSDP version 1"),
    (False, True, True, None),  # FSDP2: the sync copies shards (test_two_processes_match_one[fsdp])
    (False, False, False, None),
])
def test_distributed_set_ups_the_bridge_refuses(deepspeed, fsdp, fsdp2, refused):
    from types import SimpleNamespace

    from humanline.integrations._trl_guard import check_setup

    trainer = SimpleNamespace(is_deepspeed_enabled=deepspeed, is_fsdp_enabled=fsdp,
                              accelerator=SimpleNamespace(is_fsdp2=fsdp2), loss_types=["sigmoid"],
                              args=SimpleNamespace(sync_ref_model=False, use_weighting=False))
    if refused is None:
        check_setup(trainer, "dpo")
        return
    with pytest.raises(ValueError, match=refused):
        check_setup(trainer, "dpo")
