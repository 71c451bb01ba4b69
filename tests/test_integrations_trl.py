"""humanline.integrations.trl: TRL's DPO/KTO/GRPO trainers made humanline, against our Trainer.

Parity (the claim of docs/trl.md): on the same micro-batches, TRL + `make_humanline` and our `Trainer` give
the same loss for every micro-batch, the same clipped gradients before every update and the same weights
after the run, at k = 1 and k = 4, with TRL's model-based and precomputed reference, with gradient
accumulation, for DPO, KTO and GRPO on fixed completions. Our side is float64 throughout; TRL's fused
log-prob head computes its softmax in float32 whatever the weights' dtype, hence the 1e-5 tolerances.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl", reason="the TRL integration needs trl (pip install 'humanline[trl]')")

import helpers_trl as H  # noqa: E402
from humanline.integrations.trl import HumanlineArgs, make_humanline  # noqa: E402

@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """TRL's TrainingArguments and our Trainer each set up accelerate's process-wide state, differently."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


# (objective, k, grad_accum, TRL reference, steps): k = 4 runs past a second sync (steps 5.. use theta_4)
CASES = [
    ("dpo", 1, 1, "model", 4),
    ("dpo", 4, 2, "precompute", 6),
    ("kto", 1, 2, "model", 4),
    ("kto", 4, 1, "precompute", 6),
    ("grpo", 1, 1, "model", 4),
    ("grpo", 4, 2, "model", 6),
]


def _parity(tmp_path, objective, k, ga, reference, steps, *, mb=2, grpo_beta=0.01):
    ours = H.ours(objective, tmp_path / "ours", k=k, steps=steps, mb=mb, ga=ga, grpo_beta=grpo_beta)
    init = H.copy.deepcopy(ours.run.unwrapped)
    batches = [b for s in range(steps) for b in ours.run.schedule(s)]
    mine = H.run_ours(ours, steps)
    trl = H.trl_trainer(objective, init, ours.run.tokenizer, tmp_path / "trl", mb=mb, ga=ga, steps=steps,
                        reference=reference, grpo_beta=grpo_beta)
    make_humanline(trl, HumanlineArgs(sync_every=k, low=H.BAND[0], high=H.BAND[1]))
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


@pytest.mark.parametrize("objective,k,ga,reference,steps", CASES)
def test_trl_matches_our_trainer(tmp_path, objective, k, ga, reference, steps):
    init, ours, mine, trl, theirs = _parity(tmp_path, objective, k, ga, reference, steps)
    _assert_same(init, ours, mine, trl, theirs, steps, ga)
    assert trl.humanline.sync.syncs == len(range(0, steps, k))

