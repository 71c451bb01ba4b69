"""Tokenisation with a real chat template, the truncation policy, and collation masks."""

from __future__ import annotations

import pytest
import torch

from humanline.core import token_logps
from humanline.data import (
    GroupRecord,
    Location,
    PairRecord,
    UnpairedRecord,
    collate_dpo,
    collate_grpo,
    collate_kto,
    encode_completion,
    encode_groups,
    encode_pairs,
    encode_prompt,
    encode_unpaired,
    fit_lengths,
)
from humanline.errors import UserError
from humanline.model.tiny import make_model, make_tokenizer

PAD = 0


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture
def plain_tok():
    tokenizer = make_tokenizer()
    tokenizer.chat_template = None
    return tokenizer


def test_chat_template_prompt_ends_with_generation_prompt_and_completion_is_the_rest(tok):
    """ChatML: the prompt is `<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n` (1 + 5 + 2 + 1 + 1 + 1
    + 10 = 21 tokens, one per character or special token); the completion adds `ok<|im_end|>\\n` (4 tokens)."""
    prompt = encode_prompt(tok, "hi")
    assert len(prompt) == 21
    assert tok.decode(prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    completion = encode_completion(tok, "hi", "ok")
    assert tok.decode(completion) == "ok<|im_end|>\n" and completion[2] == tok.eos_token_id
    as_messages = [{"role": "user", "content": "hi"}]
    assert encode_prompt(tok, as_messages) == prompt
    assert encode_completion(tok, as_messages, [{"role": "assistant", "content": "ok"}]) == completion


def test_conversational_prompt_keeps_all_turns(tok):
    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    text = tok.decode(encode_prompt(tok, prompt))
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    two_turns = [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert tok.decode(encode_completion(tok, prompt, two_turns)) == (
        "a<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n")


def test_without_chat_template_text_then_eos(plain_tok):
    assert plain_tok.decode(encode_prompt(plain_tok, "hi")) == "hi"
    assert encode_completion(plain_tok, "hi", "ok") == plain_tok("ok", add_special_tokens=False)["input_ids"] + [
        plain_tok.eos_token_id]
    with pytest.raises(UserError, match="has no chat template, so conversational"):
        encode_prompt(plain_tok, [{"role": "user", "content": "hi"}])


def test_template_whose_prompt_is_not_a_prefix_is_a_clear_error():
    tokenizer = make_tokenizer()
    # The generation prompt says 'assistant' but assistant turns are rendered as 'bot': no common prefix.
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ 'bot' if m['role'] == 'assistant' else m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    # Tokens 0-10 are '<|im_start|>user\nhi<|im_end|>\n<|im_start|>'; token 11 is 'a' against 'b'.
    with pytest.raises(UserError) as err:
        encode_completion(tokenizer, "hi", "ok")
    assert f"chat template of '{type(tokenizer).__name__}' does not render the prompt" in str(err.value)
    assert "differ at token 11: 'assistan' vs 'bot\\nok<|im_end|>\\n'" in str(err.value)


@pytest.mark.parametrize(
    "prompt_len, completion_lens, max_prompt, max_len, expected",
    [
        (3, [2], None, 5, (3, [2], False)),  # exact fit: nothing cut
        (3, [4], None, 4, (3, [1], True)),  # room for exactly one completion token
        (3, [1], None, 3, None),  # prompt fills max_length: no room
        (10, [4, 9], 6, 12, (6, [4, 6], True)),  # prompt keeps its end, completions their start
        (10, [4], 10, 10, None),  # max_prompt_length does not help when it is >= max_length
        (5, [50], None, None, (5, [50], False)),  # no limits
        (8, [1], 2, None, (2, [1], True)),  # only the prompt limit
    ],
)
def test_fit_lengths_edge_cases(prompt_len, completion_lens, max_prompt, max_len, expected):
    prompt = list(range(100, 100 + prompt_len))
    completions = [list(range(n)) for n in completion_lens]
    fitted = fit_lengths(prompt, completions, max_prompt_length=max_prompt, max_length=max_len)
    if expected is None:
        assert fitted is None
        return
    kept_prompt, kept, truncated = fitted
    assert (len(kept_prompt), [len(c) for c in kept], truncated) == expected
    assert kept_prompt == prompt[len(prompt) - len(kept_prompt):]  # the END of the prompt
    assert all(c == full[: len(c)] for c, full in zip(kept, completions))  # the START of each completion


def test_encode_pairs_counts_truncation_and_drops_prompts_without_room(tok):
    """Prompt 'hi' is 21 tokens, 'a long prompt' 32; completions 'ok' 4 and 'no way' 8 tokens.
    max_length 26: record 1 fits chosen (25) but rejected is cut to 5; record 2 has no room."""
    records = [PairRecord("hi", "ok", "no way", "p1"),
               PairRecord("a long prompt", "x", "y", "p2", source=Location("d.jsonl", 2))]
    result = encode_pairs(records, tok, max_prompt_length=None, max_length=26)
    assert result.truncated == 1 and result.dropped == 1 and len(result.units) == 1
    unit = result.units[0]
    assert unit["id"] == "p1" and len(unit["prompt"]) == 21
    assert tok.decode(unit["chosen"]) == "ok<|im_end|>\n" and tok.decode(unit["rejected"]) == "no wa"
    assert str(result.problems[0]) == ("d.jsonl:2: field 'prompt': prompt is 32 tokens (max_prompt_length=None), "
                                       "leaving no room for a completion within max_length=26")
    with pytest.raises(UserError, match="max_length: expected a positive number of tokens, got 0"):
        encode_pairs(records, tok, max_prompt_length=None, max_length=0)


def test_encode_unpaired_and_groups_units(tok):
    kto = encode_unpaired([UnpairedRecord("hi", "ok", False, "p")], tok, max_prompt_length=8, max_length=64)
    assert kto.units == [{"id": "p", "prompt": encode_prompt(tok, "hi")[-8:], "completion": encode_completion(
        tok, "hi", "ok"), "desirable": False}]
    assert kto.truncated == 1  # 21 prompt tokens kept to the last 8
    grpo = encode_groups([GroupRecord("hi", ["a", "bb", "ccc"], [0.5, 1.0, -2.0], "g")], tok,
                         max_prompt_length=64, max_length=64)
    unit = grpo.units[0]
    assert unit["rewards"] == [0.5, 1.0, -2.0] and [len(c) for c in unit["completions"]] == [3, 4, 5]


def test_collate_dpo_exact_positions():
    """Unit 0: prompt [5, 6, 7], chosen [8], rejected [9, 10, 11]; unit 1: prompt [12], chosen [13, 14],
    rejected [15]. Longest row is 3 + 3 = 6. Rows: chosen 0, chosen 1, rejected 0, rejected 1."""
    units = [{"id": "a", "prompt": [5, 6, 7], "chosen": [8], "rejected": [9, 10, 11]},
             {"id": "b", "prompt": [12], "chosen": [13, 14], "rejected": [15]}]
    batch = collate_dpo(units, PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 0, 0], [12, 13, 14, 0, 0, 0],
                                           [5, 6, 7, 9, 10, 11], [12, 15, 0, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0],
                                                [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]]
    F, T = False, True
    assert batch["completion_mask"].tolist() == [[F, F, F, T, F, F], [F, T, T, F, F, F],
                                                 [F, F, F, T, T, T], [F, T, F, F, F, F]]
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
    assert batch["completion_mask"].dtype == torch.bool and batch["ids"] == ["a", "b"]


def test_collate_kto_mismatched_pairs_are_a_cyclic_shift():
    """KL row i = prompt i + completion of unit (i + 1) mod 3: [1] + [20, 21], [2, 2] + [30], [3] + [10]."""
    units = [{"id": "a", "prompt": [1], "completion": [10], "desirable": True},
             {"id": "b", "prompt": [2, 2], "completion": [20, 21], "desirable": False},
             {"id": "c", "prompt": [3], "completion": [30], "desirable": True}]
    batch = collate_kto(units, PAD)
    assert batch["input_ids"].tolist() == [[1, 10, 0, 0], [2, 2, 20, 21], [3, 30, 0, 0]]
    assert batch["desirable"].tolist() == [True, False, True]
    assert batch["kl_input_ids"].tolist() == [[1, 20, 21], [2, 2, 30], [3, 10, 0]]
    assert batch["kl_completion_mask"].tolist() == [[False, True, True], [False, False, True], [False, True, False]]
    assert batch["kl_attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0]]
    single = collate_kto(units[:1], PAD)
    assert not single["kl_completion_mask"].any() and single["completion_mask"].tolist() == [[False, True]]


def test_collate_grpo_flattens_groups():
    units = [{"id": "g0", "prompt": [1, 1], "completions": [[5], [6, 6]], "rewards": [1.0, 0.0]},
             {"id": "g1", "prompt": [2], "completions": [[7], [8], [9, 9, 9]], "rewards": [0.5, 0.25, 2]}]
    batch = collate_grpo(units, PAD)
    assert batch["input_ids"].tolist() == [[1, 1, 5, 0], [1, 1, 6, 6], [2, 7, 0, 0], [2, 8, 0, 0], [2, 9, 9, 9]]
    assert batch["completion_mask"].sum(dim=1).tolist() == [1, 2, 1, 1, 3]
    assert batch["group_ids"].tolist() == [0, 0, 1, 1, 1] and batch["group_ids"].dtype == torch.long
    assert batch["rewards"].tolist() == [1.0, 0.0, 0.5, 0.25, 2.0] and batch["rewards"].dtype == torch.float32
    assert batch["ids"] == ["g0", "g1"]


def test_collated_masks_label_only_completion_tokens_of_real_text(tok):
    """On real encodings: masked positions decode to exactly the completions, never prompt or padding, and
    `token_logps` on a tiny model yields one log-prob per completion token."""
    records = [PairRecord("What is 2+2?", "4", "It is five.", "a"),
               PairRecord([{"role": "user", "content": "Hi"}], [{"role": "assistant", "content": "Hello there"}],
                          [{"role": "assistant", "content": "Go"}], "b")]
    units = encode_pairs(records, tok, max_prompt_length=64, max_length=128).units
    batch = collate_dpo(units, tok.pad_token_id)
    expected = ["4<|im_end|>\n", "Hello there<|im_end|>\n", "It is five.<|im_end|>\n", "Go<|im_end|>\n"]
    for row, text in enumerate(expected):
        ids = batch["input_ids"][row][batch["completion_mask"][row]].tolist()
        assert tok.decode(ids) == text
        assert not (batch["completion_mask"][row] & (batch["attention_mask"][row] == 0)).any()
    model = make_model(tok)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps, mask = token_logps(logits, batch["input_ids"], batch["completion_mask"])
    assert mask.sum(dim=1).tolist() == [len(u[k]) for k in ("chosen", "rejected") for u in units]
    assert torch.isfinite(logps).all() and (logps[mask] < 0).all()
