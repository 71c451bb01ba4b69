"""humanline.integrations.trl through TRL's own data path (real `train()` on a real `datasets.Dataset`, nothing
replaced): the reference each step used is the pre-update snapshot the sync rule names, DPO's loss and gradient
are those of our pure `dpo_loss` on the same log-probs, reference forwards are deterministic with LoRA dropout,
the auto band reaches TRL users, and settings that change the method are refused at `make_humanline`."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("trl", reason="the TRL integration needs trl (pip install 'humanline[trl]')")

import helpers_trl as H  # noqa: E402
from humanline.integrations.trl import REFERENCE_ADAPTER, HumanlineArgs, make_humanline  # noqa: E402
from humanline.objectives import dpo_loss  # noqa: E402


def _recorded(trainer):
    """Record every reference forward (step, arguments, result), the policy's weights at each step's start,
    TRL's loss per call and the gradient before each update."""
    from transformers import TrainerCallback

    loss, rec = trainer.humanline, {"calls": [], "policy": [], "losses": [], "grads": []}
    real_reference = loss._reference_logps

    def reference_logps(args, kwargs):
        out = real_reference(args, kwargs)
        rec["calls"].append((trainer.state.global_step, args, dict(kwargs), out.clone()))
        return out

    loss._reference_logps = reference_logps
    real_loss = trainer.compute_loss

    def compute_loss(model, inputs, **kwargs):
        value = real_loss(model, inputs, **kwargs)
        rec["losses"].append(float(value.detach()))
        return value

    trainer.compute_loss = compute_loss

    class Snapshots(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            rec["policy"].append(copy.deepcopy(trainer.model.state_dict()))

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            rec["grads"].append({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.add_callback(Snapshots())
    return rec


def _model_at(trainer, state: dict) -> torch.nn.Module:
    model = copy.deepcopy(trainer.model)  # its humanline hook is inert outside compute_loss
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("objective,k", [("dpo", 2), ("kto", 3), ("grpo", 2)])
def test_reference_of_each_step_is_the_snapshot_the_rule_names(tmp_path, objective, k):
    """At step s the reference forward equals a forward of theta_j, j = the last sync step before s (theta_0 at
    s = 0), on the very arguments TRL passed (KTO: its mismatched pairs too; GRPO: its own generations)."""
    steps = 5
    trainer = make_humanline(H.own_pipeline(objective, tmp_path, steps=steps), HumanlineArgs(sync_every=k))
    rec = _recorded(trainer)
    trainer.train()
    assert {s for s, *_ in rec["calls"]} == set(range(steps))
    for step, args, kwargs, ref in rec["calls"]:
        j = 0 if step == 0 else (step - 1) // k * k
        model = _model_at(trainer, rec["policy"][j]).eval()
        with torch.no_grad():
            expected = model(*args, **kwargs).log_probs
        assert torch.equal(ref, expected), f"step {step}: not theta_{j}"
        if step - 1 > j:  # a later snapshot would differ: the check can fail
            with torch.no_grad():
                later = _model_at(trainer, rec["policy"][step - 1]).eval()(*args, **kwargs).log_probs
            assert not torch.equal(ref, later)


def test_dpo_loss_and_gradient_are_the_pure_objective_on_the_same_log_probs(tmp_path):
    """TRL's DPO loss and the gradient before each update equal our pure `dpo_loss` on clip(policy - ref) of the
    same forward (TRL's concatenated chosen/rejected rows), with theta_s as policy and the rule's theta_j as
    reference. max_grad_norm is large so the gradient compared is the raw one."""
    band, steps = (-0.02, 0.02), 4
    trainer = H.own_pipeline("dpo", tmp_path, steps=steps, max_grad_norm=1e9, learning_rate=2e-2)
    make_humanline(trainer, HumanlineArgs(sync_every=1, low=band[0], high=band[1]))
    rec = _recorded(trainer)
    trainer.train()
    assert len(rec["calls"]) == len(rec["losses"]) == len(rec["grads"]) == steps
    clipped = 0
    for (step, args, kwargs, _), trl_loss, trl_grads in zip(rec["calls"], rec["losses"], rec["grads"]):
        policy = _model_at(trainer, rec["policy"][step]).train()
        with torch.no_grad():
            ref = _model_at(trainer, rec["policy"][max(step - 1, 0)]).eval()(*args, **kwargs).log_probs
        logps = policy(*args, **kwargs).log_probs
        mask = kwargs["labels"][:, 1:] != -100
        raw = logps - ref
        clipped += int(((raw.detach() < band[0]) | (raw.detach() > band[1]))[mask].sum())
        lr = raw.clamp(*band)
        half = lr.shape[0] // 2
        out = dpo_loss(lr[:half], lr[half:], mask[:half], mask[half:], beta=trainer.args.beta)
        assert trl_loss == pytest.approx(float(out.loss), rel=1e-5, abs=1e-7), f"step {step}"
        out.loss.backward()
        ours = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        assert ours.keys() == trl_grads.keys()
        for name, grad in ours.items():
            assert torch.allclose(trl_grads[name], grad, rtol=1e-4, atol=1e-7), f"step {step}: {name}"
    assert clipped > 0, "the band never clipped: the check would not exercise the transform"


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
def test_lora_dropout_does_not_reach_the_reference(tmp_path, objective):
    """Finding 1: a LoRA policy with lora_dropout 0.1. After two steps (k = 1) the reference adapter holds
    theta_1 (B no longer 0, so dropout on it would show); two reference forwards on the same arguments, with the
    policy in training mode, agree exactly and the reference adapter carries no dropout."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"],
                      task_type="CAUSAL_LM")
    trainer = make_humanline(H.own_pipeline(objective, tmp_path, steps=2, peft_config=lora),
                             HumanlineArgs(sync_every=1))
    rec = _recorded(trainer)
    trainer.train()
    model = trainer.model
    twins = [p for n, p in model.named_parameters() if f".{REFERENCE_ADAPTER}." in n and "lora_B" in n]
    assert twins and any(bool(p.abs().sum() > 0) for p in twins)
    assert model.peft_config[REFERENCE_ADAPTER].lora_dropout == 0.0
    _, args, kwargs, _ = rec["calls"][-1]
    model.train()
    first = trainer.humanline._reference_logps(args, kwargs)
    second = trainer.humanline._reference_logps(args, kwargs)
    assert torch.equal(first, second)
    assert model.training  # the policy's own mode is restored


def test_auto_band_reaches_trl_users(tmp_path):
    """band="auto" through TRL: the bounds hold while the windows carry no drift (step 0's ratios are all 0),
    then move at the next sync towards the observed quantiles; the logged bounds are the ones in use, and the
    token shares below, inside and above them add up to 1."""
    trainer = make_humanline(H.own_pipeline("dpo", tmp_path, steps=4, learning_rate=2e-2),
                             HumanlineArgs(sync_every=1, band="auto", band_rate=1.0))
    trainer.train()
    lows, highs = H.logged(trainer, "humanline/low"), H.logged(trainer, "humanline/high")
    assert lows[:2] == [-1.5, -1.5] and highs[:2] == [1.5, 1.5]
    assert lows[2] < 0 < highs[2] and (lows[2], highs[2]) != (-1.5, 1.5)
    for key in ("inside_band", "below_band", "above_band"):
        assert len(H.logged(trainer, f"humanline/{key}")) == 4
    total = [sum(x) for x in zip(*(H.logged(trainer, f"humanline/{k}")
                                   for k in ("inside_band", "below_band", "above_band")))]
    assert total == pytest.approx([1.0] * 4)


def test_grpo_kl_bias_correction_with_a_kl_term_is_refused(tmp_path):
    """Finding 2: TRL's default use_bias_correction_kl=True reweights the KL term when beta > 0."""
    with pytest.raises(ValueError, match="use_bias_correction_kl"):
        make_humanline(H.own_pipeline("grpo", tmp_path / "a", steps=1, use_bias_correction_kl=True))
    make_humanline(H.own_pipeline("grpo", tmp_path / "b", steps=1, use_bias_correction_kl=True, beta=0.0))


def test_prompt_tuning_is_refused_when_made_humanline(tmp_path):
    """Finding 4: a prompt-learning adapter is refused by make_humanline, not at the first training step."""
    from peft import PromptTuningConfig, get_peft_model

    from humanline.model.tiny import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    policy = get_peft_model(make_model(tokenizer), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    trainer = H.own_pipeline("dpo", tmp_path, steps=1)
    trainer.model = policy  # what a PeftModel passed to TRL becomes
    with pytest.raises(ValueError, match="prompt-learning"):
        make_humanline(trainer)


def test_enabled_false_is_refused():
    with pytest.raises(ValueError, match="enabled"):
        make_humanline(None, HumanlineArgs(enabled=False))
