"""Parity of the fast forward paths (fused output head, packed rows, padded widths) with the plain padded
computation, and the fallbacks for models that do not allow them."""

from __future__ import annotations

import torch

import humanline.model.capabilities as capability
import humanline.model.forward as fwd
from humanline.data.collate import collate_dpo, collate_kto
from humanline.model.tiny import make_model, make_tokenizer

TOK = make_tokenizer()


def _ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def _dpo_batch() -> dict:
    """4 pairs with prompts of 4..16 characters and completions of 1..5: real lengths 6..18 in 18 columns."""
    units = [{"id": i, "prompt": _ids("12+3" * (i + 1)), "chosen": _ids("15" * (i % 3 + 1)),
              "rejected": _ids("x" * (5 - i))} for i in range(4)]
    return collate_dpo(units, TOK.pad_token_id)


def _model(seed: int = 0):
    model = make_model(TOK, hidden_size=32, num_layers=2, seed=seed)
    # Larger weights than the default init make logits (and cross-sequence leaks) clearly non-zero.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0)
    return model


def _plain(model, batch: dict, prefix: str = "") -> torch.Tensor:
    """Full logits of the padded batch, a float64 log-softmax over the whole vocabulary, then the labels'
    entries (shifted by one) where the completion mask is set: no selection, no packing, no chunking."""
    ids, attn = batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"]
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
    logps = logits[:, :-1].double().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logps * batch[f"{prefix}completion_mask"][:, 1:]


def _caps(model) -> tuple[bool, bool]:
    caps = capability.CAPABILITIES[model]
    return caps.fused, caps.pack


class IgnoresPositions(torch.nn.Module):
    """A model that drops `position_ids`: packed sequences would attend to each other."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, position_ids=None, **kwargs):
        return self.inner(**kwargs)


class SoftCapped(torch.nn.Module):
    """A model that post-processes its logits (tanh soft-capping, as some architectures do)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = 3.0 * torch.tanh(out.logits / 3.0)
        return out


class NoOutputLayer(torch.nn.Module):
    """A model that does not expose its vocabulary projection."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        return self.inner(**kwargs)


def test_first_fit_decreasing_and_packed_layout_hand_example():
    """Lengths [5, 2, 3], L = 5: longest first -> row 0 = [seq 0]; seq 2 opens row 1; seq 1 (2 tokens) fits in
    row 1's remaining 2. Row 1 holds seq 2 at positions 0..2 then seq 1 at 0..1. `scored[n, t]` means token
    t + 1 is scored: seq 0's tokens 3, 4 (predicted at positions 1, 2) and seq 1's token 7 (predicted at its
    position 0, packed column 3: flat position 5 + 3). Output slots in the (3, 4) result: row 0 cols 1, 2 -> 1, 2;
    row 1 col 0 -> 4."""
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 0, 0, 0], [8, 9, 10, 0, 0]])
    scored = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert fwd._first_fit_decreasing([5, 2, 3], 5) == [[0], [2, 1]]
    layout = fwd.packed_layout(ids, scored, [5, 2, 3])
    assert layout.input_ids.tolist() == [[1, 2, 3, 4, 5], [8, 9, 10, 6, 7]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert layout.keep.tolist() == [1, 2, 8]  # row-major positions: row 0 cols 1, 2; row 1 col 3
    assert layout.targets.tolist() == [3, 4, 7]
    assert layout.scatter.tolist() == [1, 2, 4]


def test_row_capacity_follows_the_cost_model():
    """Lengths [3, 2, 2], L = 3. Capacity 3 keeps every sequence alone (3 x 3, no gain). Capacity 6: rows
    [3, 2] and [2], 2 x 5 = 10 slots. Capacity 12: one row of 7. Cost rows x width x (1 + width / 6d):
    with d = 1e6 attention is free, so 1 x 7 = 7 < 9 (padded) -> one row; with d = 1 the padded batch costs
    9 x (1 + 3/6) = 13.5 and one row 7 x (1 + 7/6) = 15.2, two rows 10 x (1 + 5/6) = 18.3 -> no packing."""
    assert fwd._choose_rows([3, 2, 2], 3, None) is None  # unknown width: capacity L only
    assert fwd._choose_rows([3, 2, 2], 3, 10**6) == ([[0, 1, 2]], 7)
    assert fwd._choose_rows([3, 2, 2], 3, 1) is None


def test_packing_saves_nothing_returns_none():
    ids = torch.ones(2, 4, dtype=torch.long)
    assert fwd.packed_layout(ids, torch.ones(2, 3, dtype=torch.bool), [4, 4]) is None


def test_packed_values_and_gradients_match_plain_padded_forward():
    batch = _dpo_batch()
    fast_model, plain_model = _model(), _model()
    fast = fwd.part_logps(fast_model, batch)
    assert _caps(fast_model) == (True, True)
    assert fwd.packed_layout(batch["input_ids"], fwd.completion_mask(batch), batch["attention_mask"].sum(1).tolist(),
                             32) is not None  # the batch does get packed
    plain = _plain(plain_model, batch)
    torch.testing.assert_close(fast.double(), plain, rtol=1e-5, atol=1e-5)
    weights = torch.randn(fast.shape, generator=torch.Generator().manual_seed(1))
    (fast * weights).sum().backward()
    (plain * weights.double()).sum().backward()
    for (name, p), q in zip(fast_model.named_parameters(), plain_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * float(q.grad.abs().max()), msg=name)


def test_model_ignoring_position_ids_is_not_packed_and_stays_exact():
    batch = _dpo_batch()
    inner = _model()
    broken = IgnoresPositions(inner)
    out = fwd.part_logps(broken, batch)
    assert _caps(broken) == (True, False)
    torch.testing.assert_close(out.double(), _plain(inner, batch), rtol=1e-5, atol=1e-5)


def _plain_capped(inner, batch: dict) -> torch.Tensor:
    ids, attn = batch["input_ids"], batch["attention_mask"]
    logits = 3.0 * torch.tanh(inner(input_ids=ids, attention_mask=attn, use_cache=False).logits / 3.0)
    logps = logits[:, :-1].double().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logps * batch["completion_mask"][:, 1:]


def test_models_that_do_not_allow_the_fused_head_fall_back_to_full_logits_and_say_why():
    batch = _dpo_batch()
    inner = _model()
    capped = SoftCapped(inner)
    out = fwd.part_logps(capped, batch)
    assert _caps(capped) == (False, False)
    assert "post-processes its logits" in capability.forward_path(capped)
    torch.testing.assert_close(out.double(), _plain_capped(inner, batch), rtol=1e-5, atol=1e-5)
    hidden = NoOutputLayer(inner)
    out = fwd.part_logps(hidden, batch)
    assert _caps(hidden) == (False, False)
    assert capability.forward_path(hidden).startswith("full logits (the output layer is NoneType")
    torch.testing.assert_close(out.double(), _plain(inner, batch), rtol=1e-5, atol=1e-5)
    assert capability.forward_path(_model()) is None  # not probed before its first batch
    fwd.part_logps(inner, batch)
    assert capability.forward_path(inner) == ("fused output head, packed rows (prompts not shared: the shared prompts "
                                       "are too short to pay for a second forward)")  # DPO pairs of short prompts


def test_padded_widths_give_the_same_values():
    """Rows padded to a multiple of 64 (what accelerators get) change no value, whichever attention mask the
    model gets (its own from the 2D mask or positions, or a prepared 4D one, boolean or additive)."""
    batch = _dpo_batch()
    model = _model()
    scored = fwd.completion_mask(batch)
    lengths = batch["attention_mask"].sum(1).tolist()
    for style in (None, torch.bool, torch.float32):  # the model's own masks, prepared SDPA and eager ones
        for build in (lambda m: fwd.padded_layout(batch["input_ids"], batch["attention_mask"], scored, multiple=m,
                                                  style=style),
                      lambda m: fwd.packed_layout(batch["input_ids"], scored, lengths, 32, multiple=m, style=style)):
            layout, wide = build(1), build(64)
            assert wide.input_ids.shape[1] == 64 and wide.keep.shape == layout.keep.shape
            assert torch.equal(wide.targets, layout.targets) and torch.equal(wide.scatter, layout.scatter)
            narrow_out = fwd.fused_forward(model, layout.model_inputs(), layout.keep, layout.targets)
            wide_out = fwd.fused_forward(model, wide.model_inputs(), wide.keep, wide.targets)
            torch.testing.assert_close(wide_out, narrow_out, rtol=1e-5, atol=1e-5)


def test_left_padded_rows_use_the_padded_layout():
    """Left padding (not what collate produces) is detected and never packed; values stay exact."""
    batch = _dpo_batch()
    lengths = batch["attention_mask"].sum(1)
    shifted = {k: torch.stack([torch.roll(row, int(batch["input_ids"].shape[1] - n))
                               for row, n in zip(batch[k], lengths)])
               for k in ("input_ids", "attention_mask", "completion_mask")}
    model = _model()
    torch.testing.assert_close(fwd.part_logps(model, shifted).double(), _plain(model, shifted), rtol=1e-5, atol=1e-5)


def test_kto_kl_part_and_empty_rows():
    """The KTO mismatched part goes through the same path; a batch with no completion token gives zeros."""
    units = [{"id": i, "prompt": _ids("7+" * (i + 1)), "completion": _ids("9" * (3 - i)), "desirable": i % 2 == 0}
             for i in range(3)]
    batch = collate_kto(units, TOK.pad_token_id)
    model = _model()
    torch.testing.assert_close(fwd.part_logps(model, batch, "kl").double(), _plain(model, batch, "kl_"),
                               rtol=1e-5, atol=1e-5)
    single = collate_kto(units[:1], TOK.pad_token_id)  # one example: its KL mask is all false
    out = fwd.part_logps(model, single, "kl")
    assert out.shape == (1, single["kl_input_ids"].shape[1] - 1) and (out == 0).all()


def test_no_grad_parts_share_one_forward_and_match_separate_calls():
    """KTO reference pass: main and mismatched parts stacked into one (packed) forward give the same
    log-probs, in each part's own (N, L - 1) layout, as one forward per part."""
    units = [{"id": i, "prompt": _ids("7+" * (i + 1)), "completion": _ids("9" * (4 - i)), "desirable": i % 2 == 0}
             for i in range(4)]
    batch = collate_kto(units, TOK.pad_token_id)
    model = _model()
    together = fwd.batch_logps_no_grad(model, batch)
    with torch.no_grad():
        for part in ("main", "kl"):
            alone = fwd.part_logps(model, batch, part)
            assert together[part].shape == alone.shape
            torch.testing.assert_close(together[part], alone, rtol=1e-5, atol=1e-5)
