"""Rollout: shapes, n per prompt, stop strings, eos handling, seeding, mode restore, left padding."""

from __future__ import annotations

import pytest
import torch

from humanline.data.tokenization import encode_prompt
from humanline.errors import UserError
from humanline.model.tiny import make_model, make_tokenizer
from humanline.sampling.rollout import GenerationConfig, HFGenerateBackend, Rollout, cut_completion, generate

PROMPTS = ["hi", "What is 14 + 26?", "a much longer prompt, to force left padding"]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok, hidden_size=64, num_layers=2, seed=1)


def _eos_bias_hook(model, tok, bias: float):
    """Add `bias` to the eos logit so the random tiny model ends completions early (returns the hook handle)."""
    delta = torch.zeros(len(tok))
    delta[tok.eos_token_id] = bias
    return model.lm_head.register_forward_hook(lambda mod, inp, out: out + delta)


def test_shapes_n_per_prompt_and_texts(model, tok):
    cfg = GenerationConfig(max_new_tokens=6, n=3, seed=0, batch_size=2)
    r = generate(model, tok, PROMPTS, cfg)
    assert isinstance(r, Rollout)
    assert len(r.prompt_ids) == len(r.completion_ids) == len(r.texts) == len(r.finish_reasons) == 3
    for i, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": prompt}]
        chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert r.prompt_ids[i] == tok(chat, add_special_tokens=False)["input_ids"]
        assert len(r.completion_ids[i]) == len(r.texts[i]) == 3
        for ids, text, why in zip(r.completion_ids[i], r.texts[i], r.finish_reasons[i]):
            assert 1 <= len(ids) <= 6
            assert text == tok.decode(ids, skip_special_tokens=True)
            assert why in ("eos", "length") and (why == "length") == (len(ids) == 6 and ids[-1] != tok.eos_token_id)
    assert r.num_generated_tokens == sum(len(c) for g in r.completion_ids for c in g)
    assert r.seconds > 0


def _manual_greedy(model, prompt_ids: list[int], steps: int, eos: int) -> list[int]:
    """Greedy decoding without generate, cache or padding: argmax of a full forward pass per step."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == eos:
                break
    return ids[len(prompt_ids) :]


def test_left_padded_batch_equals_unbatched_greedy(model, tok):
    cfg = GenerationConfig(max_new_tokens=8, temperature=0.0, batch_size=3)
    batched = generate(model, tok, PROMPTS, cfg)
    model.eval()
    for i in range(len(PROMPTS)):
        expected = _manual_greedy(model, batched.prompt_ids[i], 8, tok.eos_token_id)
        assert batched.completion_ids[i][0] == expected
    single = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=8, temperature=0.0, batch_size=1))
    assert single.completion_ids == batched.completion_ids


def test_stop_string_cuts_after_first_match(model, tok):
    free = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=10, temperature=0.0))
    text = free.texts[1][0]
    stop = text[3:5]  # a two-character string the greedy completion is known to contain
    cut = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=10, temperature=0.0, stop=[stop]))
    expected = text[: text.find(stop) + len(stop)]
    assert cut.texts[1][0] == expected
    assert cut.finish_reasons[1][0] == "stop"
    assert len(cut.completion_ids[1][0]) == len(expected)  # character tokenizer: one token per character


def test_stop_strings_with_sampling(model, tok):
    stops = list("aeiou0123")
    r = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=12, n=4, stop=stops, seed=3))
    reasons = [w for g in r.finish_reasons for w in g]
    assert "stop" in reasons
    for g_text, g_why in zip(r.texts, r.finish_reasons):
        for text, why in zip(g_text, g_why):
            first = min((text.find(s) + len(s) for s in stops if s in text), default=None)
            if why == "stop":
                assert first == len(text)  # ends right after its first stop string
            else:
                assert first is None


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_eos_ends_completion_and_padding_is_removed(tok, pad_is_eos):
    tokenizer = make_tokenizer()
    if pad_is_eos:
        tokenizer.pad_token = tokenizer.eos_token
    model = make_model(tokenizer, seed=2)
    handle = _eos_bias_hook(model, tokenizer, 3.5)  # eos probability per step becomes roughly 0.25
    try:
        r = generate(model, tokenizer, PROMPTS, GenerationConfig(max_new_tokens=8, n=4, seed=0))
    finally:
        handle.remove()
    eos = tokenizer.eos_token_id
    reasons = [w for g in r.finish_reasons for w in g]
    assert "eos" in reasons and "length" in reasons
    for group, whys in zip(r.completion_ids, r.finish_reasons):
        for ids, why in zip(group, whys):
            assert eos not in ids[:-1]
            if why == "eos":
                assert ids[-1] == eos
            else:
                assert len(ids) == 8 and ids[-1] != eos


def test_cut_rules(tok):
    """cut_completion on hand-made rows: eos kept, padding after it dropped, stop string wins when it comes first."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ab = tok("ab", add_special_tokens=False)["input_ids"]
    xyz = tok("xyz", add_special_tokens=False)["input_ids"]
    assert cut_completion(ab + [eos, pad, pad], {eos}, tok, []) == (ab + [eos], "eos")
    assert cut_completion(ab + [eos, eos], {eos}, tok, []) == (ab + [eos], "eos")  # pad == eos
    assert cut_completion(xyz, {eos}, tok, []) == (xyz, "length")
    assert cut_completion(xyz + [pad, pad], {eos}, tok, ["y"]) == (xyz[:2], "stop")
    assert cut_completion(ab + [eos] + xyz, {eos}, tok, ["y"]) == (ab + [eos], "eos")  # stop only after the eos


def test_seeded_reproducible_and_caller_rng_untouched(model, tok):
    cfg = GenerationConfig(max_new_tokens=6, n=2, seed=7)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a = generate(model, tok, PROMPTS, cfg)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = generate(model, tok, PROMPTS, cfg)
    c = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=6, n=2, seed=8))
    assert a.completion_ids == b.completion_ids
    assert a.completion_ids != c.completion_ids


def test_unseeded_sampling_follows_global_rng(model, tok):
    cfg = GenerationConfig(max_new_tokens=6, n=2)
    torch.manual_seed(5)
    a = generate(model, tok, PROMPTS, cfg)
    torch.manual_seed(5)
    b = generate(model, tok, PROMPTS, cfg)
    assert a.completion_ids == b.completion_ids


def test_samples_full_distribution_despite_defaults(tok):
    """Near-uniform distinct logits over 100 tokens, 2 x 8 x 30 draws: the full distribution shows ~99 distinct
    tokens; the model's generation_config top_k=1 or transformers' default top_k=50 would allow at most 1 or 50."""
    model = make_model(tok, seed=1)
    model.generation_config.top_k = 1
    ramp = torch.arange(len(tok), dtype=torch.float32) * 1e-3  # distinct values, so top-k has no ties
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out * 0.0 + ramp)
    try:
        r = generate(model, tok, PROMPTS[:2], GenerationConfig(max_new_tokens=30, n=8, seed=0))
    finally:
        handle.remove()
    assert len({t for g in r.completion_ids for ids in g for t in ids}) > 60


@pytest.mark.parametrize("training", [True, False])
def test_mode_restored_and_no_grad(model, tok, training):
    model.train(training)
    model.model.layers[0].eval()  # a mixed state (e.g. a frozen block) must come back as it was
    before = [m.training for m in model.modules()]
    seen = []
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append((mod.training, out.requires_grad)))
    try:
        r = generate(model, tok, PROMPTS[:2], GenerationConfig(max_new_tokens=3))
    finally:
        handle.remove()
    assert set(seen) == {(False, False)}  # sampled in eval mode without grad
    assert [m.training for m in model.modules()] == before
    assert torch.is_grad_enabled()
    assert r.num_generated_tokens > 0
    model.train(False)


def test_unwraps_wrapped_model(model, tok):
    class Wrapper(torch.nn.Module):  # what DDP / accelerate hand back: the trained module under .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    class FakeAccelerator:
        calls = 0

        def unwrap_model(self, m):
            FakeAccelerator.calls += 1
            return m.module

    cfg = GenerationConfig(max_new_tokens=5, temperature=0.0)
    plain = generate(model, tok, PROMPTS, cfg)
    assert generate(Wrapper(model), tok, PROMPTS, cfg).completion_ids == plain.completion_ids
    via_acc = generate(Wrapper(model), tok, PROMPTS, cfg, backend=HFGenerateBackend(accelerator=FakeAccelerator()))
    assert via_acc.completion_ids == plain.completion_ids and FakeAccelerator.calls == 1


def test_chat_message_prompts_are_templated(model, tok):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = generate(model, tok, [messages], GenerationConfig(max_new_tokens=2, temperature=0.0))
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert r.prompt_ids[0] == tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"n": 0}, "n"),
        ({"batch_size": 0}, "batch_size"),
        ({"stop": "</answer>"}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"temperature": 0.0, "n": 4}, "n"),  # greedy gives one completion per prompt
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(UserError, match=f"generation.{field}:"):
        GenerationConfig(**kwargs)


def _greedy_by_hand(model, ids: list[int], steps: int) -> list[int]:
    """Greedy decoding with plain full forwards (no cache, nothing compiled): the weights as they are now."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([out]), use_cache=False).logits[0, -1]
            out.append(int(logits.argmax()))
    return out[len(ids):]


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_samples_follow_weights_updated_in_place(tok, cache):
    """An optimizer updates parameters in place; the next rollout (static or dynamic KV cache) must decode
    with the new values, not with anything cached from the previous call."""
    model = make_model(tok, hidden_size=64, num_layers=2, seed=3)
    cfg = GenerationConfig(max_new_tokens=6, temperature=0, n=1, cache=cache)
    prompt_ids = encode_prompt(tok, [{"role": "user", "content": "14+26="}])
    before = HFGenerateBackend().generate(model, tok, [prompt_ids], cfg).completion_ids[0][0]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
    after = HFGenerateBackend().generate(model, tok, [prompt_ids], cfg).completion_ids[0][0]
    expected = _greedy_by_hand(model, prompt_ids, 6)
    assert after == expected[: len(after)] and before != after
