"""The shared-prompt (prefix) layout: each distinct prompt runs once, the rows on its expanded key/value cache.
Log-probs and parameter gradients must equal the plain padded forward's; models and calls that cannot use it
fall back to the other layouts and say why."""

from __future__ import annotations

import copy

import pytest
import torch

import humanline.model.capabilities as capability
import humanline.model.forward as fwd
import humanline.model.prefix as pfx
from humanline.data.collate import collate_dpo, collate_grpo
from humanline.model.tiny import make_model, make_tokenizer

TOK = make_tokenizer()


def _ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def _grpo_batch() -> dict:
    """Prompts of 24, 12 and 8 tokens in groups of 4, 2 and 1 (the last prompt is unique); completions of
    1..4 tokens: every row a different length, so prompts and rows are both padded."""
    units = [{"id": 0, "prompt": _ids("12+34=" * 4), "completions": [_ids("46"), _ids("4"), _ids("467"), _ids("x9+")]},
             {"id": 1, "prompt": _ids("7+8=" * 3), "completions": [_ids("15"), _ids("1599")]},
             {"id": 2, "prompt": _ids("9+9=" * 2), "completions": [_ids("18")]}]
    for unit in units:
        unit["rewards"] = [0.0] * len(unit["completions"])
    return collate_grpo(units, TOK.pad_token_id)


def _model(seed: int = 0):
    model = make_model(TOK, hidden_size=32, num_layers=2, seed=seed)
    with torch.no_grad():  # larger weights: clearly non-zero logits and attention differences
        for p in model.parameters():
            p.mul_(5.0)
    return model


def _plain(model, batch: dict) -> torch.Tensor:
    """Full logits of the padded batch, float64 log-softmax, the labels' entries where completion tokens are."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
    logps = logits[:, :-1].double().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logps * batch["completion_mask"][:, 1:]


@pytest.fixture
def always_pays(monkeypatch):
    """Tiny models: take the prefix layout whenever a prompt repeats (the cost rule is tested on its own)."""
    monkeypatch.setattr(pfx, "MIN_GAIN", 100.0)


def _assert_same_values_and_grads(fast_model, plain_model, batch):
    fast = fwd.part_logps(fast_model, batch)
    plain = _plain(plain_model, batch)
    torch.testing.assert_close(fast.double(), plain, rtol=1e-5, atol=1e-5)
    weights = torch.randn(fast.shape, generator=torch.Generator().manual_seed(1))
    (fast * weights).sum().backward()
    (plain * weights.double()).sum().backward()
    pairs = [(n, p, q) for (n, p), q in zip(fast_model.named_parameters(), plain_model.parameters()) if p.requires_grad]
    assert pairs
    for name, p, q in pairs:
        assert q.grad is not None and float(q.grad.abs().max()) > 0, name
        # float32 noise of a 5x-scaled model reaches ~4e-5 of the largest entry (LoRA); a lost or doubled
        # contribution of a row (e.g. a detached shared prompt) is of the order of the entries themselves
        err = float((p.grad - q.grad).abs().max() / q.grad.abs().max())
        assert err < 2e-4, f"{name}: max |grad diff| / max |grad| = {err:.2e}"


def test_prefix_layout_hand_example():
    """Rows [5 6 7 8 9] and [5 6 1 2] share the prompt [5 6] (first scored position 2); row [3 4 1] has its
    own prompt [3]. Model rows: [7 8 9] at positions 2..4, [1 2 0] at 2..4 (last column padding), [4 1 0] at
    1..3 on prompt 1 (one real token of two: mask [1 0 | ...])."""
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 1, 2, 0], [3, 4, 1, 0, 0]])
    scored = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    lengths, starts, rows = [5, 4, 3], [2, 2, 1], [0, 1, 2]
    group, sizes = pfx.shared_prompts(ids, starts, rows)
    assert (group, sizes) == ([0, 0, 1], [2, 1])
    layout = pfx.prefix_layout(ids, scored, lengths, starts, rows, group, sizes)
    assert layout.prompt_ids.tolist() == [[5, 6], [3, 0]] and layout.prompt_mask.tolist() == [[1, 1], [1, 0]]
    assert layout.group.tolist() == [0, 0, 1]
    assert layout.input_ids.tolist() == [[7, 8, 9], [1, 2, 0], [4, 1, 0]]
    assert layout.position_ids.tolist() == [[2, 3, 4], [2, 3, 4], [1, 2, 3]]
    assert layout.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 0, 1, 1, 0]]
    assert layout.keep.tolist() == [0, 1, 3, 6]  # row-major positions in the (3, 3) rows: [T T F] [T F F] [T F F]
    assert layout.targets.tolist() == [8, 9, 2, 1]
    assert layout.scatter.tolist() == [2, 3, 6, 9]  # flat indices into the (3, 4) output


def test_widths_rounded_up_give_the_same_values():
    """Prompt and row widths padded to a multiple of 64 (what accelerators get) change no value."""
    batch = _grpo_batch()
    model = _model()
    ids, scored = batch["input_ids"], fwd.completion_mask(batch)
    lengths = batch["attention_mask"].sum(1).tolist()
    starts = scored.long().argmax(1).tolist()
    rows = list(range(len(lengths)))
    group, sizes = pfx.shared_prompts(ids, starts, rows)
    narrow = pfx.prefix_layout(ids, scored, lengths, starts, rows, group, sizes)
    wide = pfx.prefix_layout(ids, scored, lengths, starts, rows, group, sizes, multiple=64)
    assert wide.prompt_ids.shape[1] == 64 and wide.input_ids.shape[1] == 64 and narrow.input_ids.shape[1] < 64
    assert torch.equal(wide.targets, narrow.targets) and torch.equal(wide.scatter, narrow.scatter)
    with torch.no_grad():
        torch.testing.assert_close(pfx.run(model, wide), pfx.run(model, narrow),
                                   rtol=1e-5, atol=1e-5)


def test_grpo_values_and_gradients_match_plain_forward(always_pays):
    batch = _grpo_batch()
    fast_model, plain_model = _model(), _model()
    _assert_same_values_and_grads(fast_model, plain_model, batch)
    caps = capability.CAPABILITIES[fast_model]
    assert caps.prefix and caps.prefix_used
    assert capability.forward_path(fast_model) == "fused output head, packed rows, shared prompts once"


def test_dpo_pairs_and_rows_without_completion_tokens(always_pays):
    """DPO pairs share their prompt; a row whose completion is empty is scored nowhere and stays 0."""
    units = [{"id": i, "prompt": _ids("12+3" * (i + 2)), "chosen": _ids("15" * (i % 3 + 1)),
              "rejected": _ids("x" * (3 - i))} for i in range(4)]  # unit 3: rejected is empty
    batch = collate_dpo(units, TOK.pad_token_id)
    fast_model, plain_model = _model(), _model()
    _assert_same_values_and_grads(fast_model, plain_model, batch)
    assert capability.CAPABILITIES[fast_model].prefix_used


def test_no_grad_forwards_use_it_too(always_pays):
    """Reference / lookahead passes (`batch_logps_no_grad`, eval mode) give the plain values."""
    batch = _grpo_batch()
    model = _model()
    with torch.no_grad():
        expected = _plain(model, batch)
    got = fwd.batch_logps_no_grad(model, batch)["main"]
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert capability.CAPABILITIES[model].prefix_used


def test_lora_values_and_gradients_match(always_pays):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"], lora_dropout=0.0)
    torch.manual_seed(0)  # lora_A's init: the same whatever tests ran before
    fast_model = get_peft_model(_model(), lora)
    for name, p in fast_model.named_parameters():  # non-zero B, so the adapters change the keys and values
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5, generator=torch.Generator().manual_seed(2))
    plain_model = copy.deepcopy(fast_model)
    batch = _grpo_batch()
    _assert_same_values_and_grads(fast_model, plain_model, batch)
    assert capability.CAPABILITIES[fast_model].prefix_used
    with fast_model.disable_adapter(), torch.no_grad():  # the lookahead reference's adapter-off pass
        off = fwd.batch_logps_no_grad(fast_model, batch)["main"]
        torch.testing.assert_close(off.double(), _plain(fast_model, batch), rtol=1e-5, atol=1e-5)


def test_cost_rule():
    """4 prompts of 35 tokens x 8 completions of 20 pays; a pair with a 3-token prompt does not (the
    second forward costs more than it saves); no repeated prompt never does."""
    lengths, starts = [55] * 32, [34] * 32
    group = [i // 8 for i in range(32)]
    assert pfx.pays(lengths, starts, list(range(32)), group, [34] * 4, 576)
    assert not pfx.pays([40, 40], [3, 3], [0, 1], [0, 0], [3], 576)
    assert not pfx.pays([40, 40], [30, 30], [0, 1], [0, 1], [30, 30], 576)


class IgnoresPositions(torch.nn.Module):
    """Drops `position_ids`: rows run on a cache would get positions 0.. instead of continuing the prompt."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, position_ids=None, **kwargs):
        return self.inner(**kwargs)


class NoCache(IgnoresPositions):
    """Never returns a key/value cache (and ignores one it is given)."""

    def forward(self, position_ids=None, **kwargs):
        for name in ("cache", "past_key_values", "use_cache"):
            kwargs.pop(name, None)
        return self.inner(position_ids=position_ids, use_cache=False, **kwargs)


class Wrapped(IgnoresPositions):
    """A DDP-like wrapper (`.module`)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.module = inner

    def forward(self, **kwargs):
        return self.inner(**kwargs)


@pytest.mark.parametrize("wrapper, reason", [(IgnoresPositions, "does not reproduce the plain one"),
                                             (NoCache, "returned no key/value cache")])
def test_models_that_cannot_fall_back_exactly_and_say_why(always_pays, wrapper, reason):
    batch = _grpo_batch()
    inner = _model()
    model = wrapper(inner)
    out = fwd.part_logps(model, batch)
    caps = capability.CAPABILITIES[model]
    assert caps.prefix is False and not caps.prefix_used
    assert reason in capability.forward_path(model) and "prompts not shared" in capability.forward_path(model)
    if wrapper is NoCache:  # positions are honoured: only the prefix layout is off
        torch.testing.assert_close(out.double(), _plain(inner, batch), rtol=1e-5, atol=1e-5)


def test_calls_that_cannot_fall_back(always_pays):
    """Gradient checkpointing (training, with gradients) and DDP-like wrappers with gradients take the other
    layouts; the no-grad passes of the same models still share prompts."""
    batch = _grpo_batch()
    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    out = fwd.part_logps(model, batch)
    torch.testing.assert_close(out.double(), _plain(model, batch), rtol=1e-5, atol=1e-5)
    assert not capability.CAPABILITIES[model].prefix_used
    assert "gradient checkpointing" in capability.forward_path(model)
    fwd.batch_logps_no_grad(model, batch)
    assert capability.CAPABILITIES[model].prefix_used

    wrapped = Wrapped(_model())
    fwd.part_logps(wrapped, batch)
    assert "DDP / FSDP" in capability.forward_path(wrapped) and not capability.CAPABILITIES[wrapped].prefix_used


def test_unshared_prompts_and_disabled_layout_use_the_usual_layouts(always_pays, monkeypatch):
    units = [{"id": i, "prompt": _ids("5+" * (i + 3)), "completions": [_ids("7" * (i + 1))], "rewards": [0.0]}
             for i in range(3)]
    model = _model()
    fwd.part_logps(model, collate_grpo(units, TOK.pad_token_id))
    assert capability.forward_path(model) == ("fused output head, packed rows (prompts not shared: no two rows "
                                              "share a prompt)")
    monkeypatch.setattr(pfx, "ENABLED", False)
    other = _model()
    fwd.part_logps(other, _grpo_batch())
    assert capability.forward_path(other) == "fused output head, packed rows"
