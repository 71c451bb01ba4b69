"""The log-probabilities a rollout records for its tokens are those of the distribution the tokens were drawn from:
the sampling weights, the temperature and top-p (docs/method.md §3.6, the behaviour policy). Checked against a
recomputation from a full forward of prompt + completion, on both HF paths (`humanline.sampling.decode` and
`model.generate`), and the `generate` path against transformers' own warpers token for token."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from humanline.data.tokenization import encode_prompt
from humanline.model.tiny import make_tokenizer
from humanline.sampling import decode
from humanline.sampling.rollout import GenerationConfig, generate

PROMPTS = ["hi", "What is 14 + 26?", "a longer prompt, to force left padding"]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def recomputed(model, prompt_ids: list[int], completion: list[int], temperature: float, top_p: float) -> torch.Tensor:
    """log softmax(decode.scores(logits)) of each completion token, from one full forward of prompt + completion."""
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1: -1].float()
    processed = decode.scores(logits, temperature, top_p).log_softmax(-1)
    return processed.gather(1, torch.tensor(completion)[:, None])[:, 0]


@pytest.mark.parametrize("decoder", ["auto", "generate"])
@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.9), (1.0, 1.0), (1.3, 0.5)])
def test_recorded_logps_are_the_sampling_distributions(model, tok, decoder, temperature, top_p):
    cfg = GenerationConfig(max_new_tokens=12, temperature=temperature, top_p=top_p, n=3, seed=5, decoder=decoder)
    rollout = generate(model, tok, PROMPTS, cfg)
    checked = 0
    for prompt_ids, group, logps in zip(rollout.prompt_ids, rollout.completion_ids, rollout.logprobs):
        for completion, recorded in zip(group, logps):
            assert len(recorded) == len(completion)
            expected = recomputed(model, prompt_ids, completion, temperature, top_p)
            assert torch.allclose(torch.tensor(recorded), expected, atol=2e-5), (recorded, expected)
            assert all(lp <= 0 for lp in recorded)
            checked += len(completion)
    assert checked > 20
    if top_p < 1:  # the nucleus renormalises: a recomputation at temperature 1 without top-p differs
        prompt_ids, completion = rollout.prompt_ids[0], rollout.completion_ids[0][0]
        plain = recomputed(model, prompt_ids, completion, 1.0, 1.0)
        assert not torch.allclose(torch.tensor(rollout.logprobs[0][0]), plain, atol=1e-3)


def test_recorded_logps_follow_the_cut_at_a_stop_string(model, tok):
    cfg = GenerationConfig(max_new_tokens=16, temperature=1.5, n=4, seed=2, stop=["a", "e"])
    rollout = generate(model, tok, PROMPTS, cfg)
    assert any(r == "stop" for reasons in rollout.finish_reasons for r in reasons)
    for group, logps in zip(rollout.completion_ids, rollout.logprobs):
        assert [len(c) for c in group] == [len(lp) for lp in logps]


def test_generate_path_draws_what_transformers_warpers_draw(model, tok):
    """The `generate` path warps logits itself (`_Warp`, to record the log-probabilities); with the same seed it
    draws exactly the tokens transformers' own temperature and top-p warpers draw."""
    cfg = GenerationConfig(max_new_tokens=10, temperature=0.7, top_p=0.9, n=2, seed=11, decoder="generate",
                           batch_size=8)
    ours = generate(model, tok, PROMPTS, cfg)
    ids = [encode_prompt(tok, p) for p in PROMPTS]
    width = max(len(p) for p in ids)
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    torch.manual_seed(11)
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=10, num_return_sequences=2,
                         do_sample=True, temperature=0.7, top_p=0.9, top_k=0, eos_token_id=[tok.eos_token_id],
                         pad_token_id=tok.pad_token_id)
    theirs = out[:, width:].tolist()
    for i, group in enumerate(ours.completion_ids):
        for j, completion in enumerate(group):
            assert theirs[i * 2 + j][:len(completion)] == completion


def test_greedy_tokens_have_log_probability_zero(model, tok):
    rollout = generate(model, tok, PROMPTS, GenerationConfig(max_new_tokens=6, temperature=0.0, n=1))
    assert all(lp == 0.0 for logps in rollout.logprobs for row in logps for lp in row)
    assert sum(len(row) for logps in rollout.logprobs for row in logps) == rollout.num_generated_tokens


@pytest.mark.parametrize("dtype", ["policy", "bfloat16"])
def test_a_stale_steps_behaviour_is_what_its_sampler_drew_with(tmp_path, dtype):
    """In the loop (stale, eta = 1, tis): step 1 trains on the initial policy's samples, drawn at T = 0.7 and top-p
    0.9 from the policy's own weights or (rollout.dtype) their bfloat16 copy. The behaviour log-probs the correction
    reads are that distribution's: the recomputation from the sampling weights at T and top-p, not the trainer's
    float32 log-probs at temperature 1."""
    import copy

    from helpers_reliability import online_config
    from humanline.training.loop import Trainer

    cfg = online_config(tmp_path / "run", 2, train={"regime": "stale", "staleness": 1},
                        objective={"correction": "tis"},
                        rollout={"temperature": 0.7, "top_p": 0.9, "dtype": dtype})
    trainer = Trainer(cfg)
    initial, sampler = copy.deepcopy(trainer.run.unwrapped), copy.deepcopy(trainer.run.unwrapped)
    if dtype == "bfloat16":
        for weights in sampler.parameters():
            weights.data = weights.data.to(torch.bfloat16)
    trainer.train_step()
    batches, gaps = trainer.run.schedule(1), []
    assert batches
    for batch in batches:
        recorded, mask = batch["behaviour_logps"], batch["completion_mask"]
        for row in range(len(recorded)):
            prompt = batch["input_ids"][row][~mask[row] & batch["attention_mask"][row].bool()].tolist()
            completion = batch["input_ids"][row][mask[row]].tolist()
            expected = recomputed(sampler, prompt, completion, 0.7, 0.9)
            assert torch.allclose(recorded[row][mask[row]], expected, atol=2e-3 if dtype == "bfloat16" else 2e-5)
            trainer_logps = recomputed(initial, prompt, completion, 1.0, 1.0)
            assert not torch.allclose(recorded[row][mask[row]], trainer_logps, atol=1e-3)
            if dtype == "bfloat16":  # the rounding of the weights shows: nearer the bf16 copy than float32 ones
                float32 = recomputed(initial, prompt, completion, 0.7, 0.9)
                gaps.append(((recorded[row][mask[row]] - float32).abs().max(),
                             (recorded[row][mask[row]] - expected).abs().max()))
    if dtype == "bfloat16":
        assert sum(f for f, _ in gaps) > 3 * sum(b for _, b in gaps), gaps
    trainer.close_sampler()
