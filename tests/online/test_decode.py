"""humanline.sampling.decode (the fast rollout loop) against transformers' generate and plain full forwards.

Tiny models are built here: Llama with grouped-query attention (4 query heads on 2 kv heads) and Qwen2 (biased
projections), sized for the character tokenizer. Greedy output must equal `model.generate` token for token;
sampled output must come from the right distribution, checked as the logits of every step against a full
forward of the prompt and the tokens so far, the top-p scores against transformers' warpers, and the draw
(inverse CDF) against hand-computed intervals and observed frequencies.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from helpers_reliability import online_sections, run_cli, write_recipe
from humanline.data.tokenization import encode_prompt
from humanline.errors import UserError
from humanline.model.tiny import make_tokenizer
from humanline.sampling import decode
from humanline.sampling.rollout import GenerationConfig, generate
from humanline.training.config_loading import load_config

PROMPTS = ["hi", "What is 14 + 26?", "a much longer prompt, to force left padding", "7+8"]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def _build(tok, kind: str, seed: int = 0):
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                  tie_word_embeddings=True)
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    return model.eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(tok, request):
    return _build(tok, request.param, seed=1)


def _eos_bias(model, tok, bias: float):
    delta = torch.zeros(len(tok))
    delta[tok.eos_token_id] = bias
    return model.lm_head.register_forward_hook(lambda mod, inp, out: out + delta)


def _eos_when(model, tok, threshold: float):
    """Make eos the argmax wherever the final hidden state's first coordinate exceeds `threshold`: a rule of the
    state alone, so rows end at different steps, identically in every decoding path (returns the hook handle)."""
    onehot = torch.zeros(len(tok))
    onehot[tok.eos_token_id] = 1e4
    return model.lm_head.register_forward_hook(
        lambda mod, inp, out: out + (inp[0][..., :1] > threshold).to(out.dtype) * onehot)


def _mixed_threshold(model, tok) -> float:
    """A `_eos_when` threshold under which greedy decoding of PROMPTS ends some rows at eos mid-way and runs
    others to length (16 tokens)."""
    cfg = GenerationConfig(max_new_tokens=16, temperature=0.0)
    for threshold in [-1.0 + 0.05 * i for i in range(60)]:
        handle = _eos_when(model, tok, threshold)
        try:
            r = generate(model, tok, PROMPTS, replace(cfg, decoder="generate"))
        finally:
            handle.remove()
        lengths = [len(ids) for g in r.completion_ids for ids in g]
        if {w for g in r.finish_reasons for w in g} == {"eos", "length"} and any(1 < n < 16 for n in lengths):
            return threshold
    raise AssertionError("no threshold gives a mixed batch")


def _both(model, tok, cfg):
    slow = generate(model, tok, PROMPTS, replace(cfg, decoder="generate"))
    fast = generate(model, tok, PROMPTS, cfg)
    return slow, fast


def test_fast_loop_applies_to_these_models(model):
    assert decode.unsupported(model, 64) is None


@pytest.mark.parametrize("stop", ["none", "one_char", "two_strings"])
def test_greedy_equals_generate(model, tok, stop):
    free = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=12, temperature=0.0))
    text = free.texts[1][0]  # stop strings the greedy completions are known to contain
    stops = {"none": [], "one_char": [text[4]], "two_strings": [text[3:5], free.texts[2][0][6]]}[stop]
    cfg = GenerationConfig(max_new_tokens=12, temperature=0.0, stop=stops, batch_size=4)
    slow, fast = _both(model, tok, cfg)
    assert fast.completion_ids == slow.completion_ids
    assert fast.finish_reasons == slow.finish_reasons and fast.texts == slow.texts
    if stops:
        assert "stop" in [w for g in fast.finish_reasons for w in g]


def test_greedy_equals_generate_with_eos_mid_batch(model, tok):
    handle = _eos_when(model, tok, _mixed_threshold(model, tok))
    try:
        cfg = GenerationConfig(max_new_tokens=16, temperature=0.0, batch_size=4)
        slow, fast = _both(model, tok, cfg)
    finally:
        handle.remove()
    reasons = [w for g in fast.finish_reasons for w in g]
    assert "eos" in reasons and "length" in reasons  # some rows end mid-batch, others run on
    assert fast.completion_ids == slow.completion_ids


@pytest.mark.parametrize("fraction", [0.0, 0.5, 2.0])  # compact whenever a row ends / at half / never
def test_compaction_does_not_change_greedy_rows(model, tok, fraction):
    prompts = [encode_prompt(tok, p) for p in PROMPTS]
    handle = _eos_when(model, tok, _mixed_threshold(model, tok))
    try:
        with torch.no_grad():
            base = decode.decode(model, prompts, n=1, max_new_tokens=16, temperature=0.0, top_p=1.0,
                                 eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, compact_fraction=2.0)
            rows = decode.decode(model, prompts, n=1, max_new_tokens=16, temperature=0.0, top_p=1.0,
                                 eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, compact_fraction=fraction)
    finally:
        handle.remove()
    assert rows == base
    assert any(r[-1] == tok.eos_token_id for r in rows) and any(len(r) == 16 for r in rows)


def test_every_step_samples_from_the_full_forward_distribution(model, tok):
    """Sampled (n=3, eos mid-batch, compaction on): the logits each draw uses equal a full, cache-free forward of
    prompt + tokens so far, for every row and step, so the draws come from the model's distribution."""
    prompts = [encode_prompt(tok, p) for p in PROMPTS]
    handle = _eos_bias(model, tok, 2.0)
    trace: list = []
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            rows = decode.decode(model, prompts, n=3, max_new_tokens=10, temperature=1.0, top_p=1.0,
                                 eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, trace=trace,
                                 compact_fraction=0.0)
            checked = 0
            for t, (live, logits) in enumerate(trace):
                for b, r in enumerate(live):
                    if t >= len(rows[r]):
                        continue  # ended at an earlier step, not yet compacted away
                    ids = prompts[r // 3] + rows[r][:t]
                    full = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
                    torch.testing.assert_close(logits[b], full, rtol=1e-4, atol=1e-4)
                    checked += 1
    finally:
        handle.remove()
    assert checked == sum(len(r) for r in rows)
    assert len({len(r) for r in rows}) > 1 and len(trace[-1][0]) < len(rows)  # rows ended; the batch shrank


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5), (1.0, 0.05)])
def test_sampling_scores_match_generate_warpers(temperature, top_p):
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    expected = warpers(torch.zeros(6, 1, dtype=torch.long), logits.clone())
    ours = decode.scores(logits, temperature, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    torch.testing.assert_close(ours.softmax(-1), expected.softmax(-1))


def test_draw_takes_the_token_whose_cumulative_interval_holds_u():
    """Hand-computed: probs (0.1, 0, 0.2, 0.7) have intervals [0, .1), empty, [.1, .3), [.3, 1)."""
    probs = torch.tensor([[0.1, 0.0, 0.2, 0.7]])
    for u, token in [(0.0, 0), (0.05, 0), (0.1, 2), (0.25, 2), (0.35, 3), (0.9, 3), (1 - 2 ** -24, 3)]:
        assert decode.draw(probs, torch.tensor([u])).item() == token, u
    # unnormalised rows are scaled by their total; several rows at once
    rows = torch.tensor([[2.0, 6.0, 0.0], [0.0, 0.0, 5.0]])
    assert decode.draw(rows, torch.tensor([0.24, 0.5])).tolist() == [0, 2]
    assert decode.draw(rows, torch.tensor([0.26, 0.0])).tolist() == [1, 2]


def test_draw_never_returns_a_zero_probability_token_at_the_top_of_the_range():
    """u just below 1 times a total that rounds up must not run past the last token of positive probability."""
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0]])
    top = torch.full((2,), 1 - 2 ** -24)
    assert decode.draw(probs, top).tolist() == [1, 2]
    assert decode.draw(probs * 3.0000002, top).tolist() == [1, 2]


def test_choose_draws_each_token_with_its_softmax_probability():
    """200,000 draws from one row of scores (two tokens outside top-p): each frequency within 5 standard errors
    of softmax(scores), and the excluded tokens never drawn."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0, 0.5])
    expected = decode.scores(logits[None], 0.8, 0.95).softmax(-1)[0]
    assert (expected == 0).sum() >= 1
    torch.manual_seed(0)
    draws, logps = decode.choose(logits.expand(200_000, -1).clone(), 0.8, 0.95)
    # each draw's log-probability is that of the distribution it came from (temperature and top-p included)
    assert torch.allclose(logps, expected.log()[draws], atol=1e-6)
    freq = torch.bincount(draws, minlength=len(logits)).double() / len(draws)
    se = (expected.double() * (1 - expected.double()) / len(draws)).sqrt()
    assert torch.all(freq[expected == 0] == 0)
    assert torch.all((freq - expected.double()).abs() <= 5 * se + 1e-12), (freq, expected)


def test_top_p_draws_only_from_the_nucleus(model, tok):
    """Few tokens in the nucleus: every sampled token must be in the top-p set of its step's logits."""
    prompts = [encode_prompt(tok, p) for p in PROMPTS]
    trace: list = []
    with torch.no_grad():
        torch.manual_seed(1)
        rows = decode.decode(model, prompts, n=4, max_new_tokens=6, temperature=1.0, top_p=0.3,
                             eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, trace=trace)
    for t, (live, logits) in enumerate(trace):
        allowed = torch.isfinite(decode.scores(logits, 1.0, 0.3))
        for b, r in enumerate(live):
            if t < len(rows[r]):
                assert allowed[b, rows[r][t]]


def test_seeded_sampling_reproducible(model, tok):
    cfg = GenerationConfig(max_new_tokens=8, n=4, seed=11, stop=["e"], batch_size=2)
    a, b = generate(model, tok, PROMPTS, cfg), generate(model, tok, PROMPTS, cfg)
    c = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=8, n=4, seed=12, stop=["e"], batch_size=2))
    assert a.completion_ids == b.completion_ids != c.completion_ids


def test_stop_cut_like_generate_when_sampling(model, tok):
    stops = list("aeiou")
    r = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=12, n=4, stop=stops, seed=3))
    for texts, whys in zip(r.texts, r.finish_reasons):
        for text, why in zip(texts, whys):
            first = min((text.find(s) + len(s) for s in stops if s in text), default=None)
            assert first == len(text) if why == "stop" else first is None


def test_unsupported_models_fall_back_to_generate_and_say_why(tok, caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=128,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)).eval()
    assert "gpt2" in decode.unsupported(gpt2, 64)
    cfg = GenerationConfig(max_new_tokens=5, temperature=0.0)
    with caplog.at_level(logging.DEBUG, logger="humanline.sampling.rollout"):
        r = generate(gpt2, tok, PROMPTS, cfg)
    assert "instead of humanline.sampling.decode" in caplog.text and "gpt2" in caplog.text
    assert r.completion_ids == generate(gpt2, tok, PROMPTS, replace(cfg, decoder="generate")).completion_ids


def test_sliding_window_shorter_than_the_sequence_falls_back(tok):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, sliding_window=16)
    mistral = MistralForCausalLM(config)
    assert decode.unsupported(mistral, 16) is None
    assert "sliding window" in decode.unsupported(mistral, 17)


def _refuse(*args, **kwargs):
    raise AssertionError("humanline.sampling.decode.decode called")


def test_decoder_generate_sends_every_call_through_model_generate(tok, monkeypatch):
    """`decoder: generate` never enters the fast loop (`auto` does, on the same model), samples all the same."""
    model = _build(tok, "llama")
    monkeypatch.setattr(decode, "decode", _refuse)
    cfg = GenerationConfig(max_new_tokens=4, temperature=1.0, n=2, seed=0, decoder="generate")
    r = generate(model, tok, PROMPTS, cfg)
    assert [len(g) for g in r.completion_ids] == [2] * len(PROMPTS) and r.num_generated_tokens > 0
    with pytest.raises(AssertionError, match="decode.decode called"):
        generate(model, tok, PROMPTS, replace(cfg, decoder="auto"))


def test_an_unknown_decoder_is_refused_naming_the_field():
    with pytest.raises(UserError, match=r"^generation.decoder: expected auto \| generate, got 'vllm'$"):
        GenerationConfig(decoder="vllm")
    with pytest.raises(UserError, match=r"rollout.decoder.*auto.*generate"):
        load_config(None, {"rollout": {"decoder": "vllm"}})


@pytest.mark.parametrize("decoder", ["auto", "generate"])
def test_rollout_decoder_reaches_the_online_sampler_and_the_eval(tmp_path, capsys, monkeypatch, decoder, device):
    """A training run samples its buffers and its held-out evaluation with `rollout.decoder`: the sampler's calls
    (n = 2, 3 new tokens) and the eval's (n = 1, 4 new tokens) are told apart by their shapes."""
    calls = set()
    real = decode.decode

    def recording(*args, **kwargs):
        calls.add((kwargs["n"], kwargs["max_new_tokens"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(decode, "decode", recording)
    sections = online_sections(tmp_path / "run")
    recipe = write_recipe(tmp_path, sections, rollout={"decoder": decoder},
                          eval={"prompts": sections["rollout"]["prompts"], "n": 1, "max_new_tokens": 4})
    code, lines = run_cli(["train", recipe], capsys)
    assert code == 0, "\n".join(lines)
    fast = decoder == "auto" and device.type == "cpu"  # the fast loop is the CPU's; on a GPU auto is generate
    assert calls == ({(2, 3), (1, 4)} if fast else set()), calls
