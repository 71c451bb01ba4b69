"""Tiny local models and tokenizers: no download, built in milliseconds.

Used by the tests, the tiny recipes (`model.name: tiny`) and the embedded demo. The tokenizer is a real
`PreTrainedTokenizerFast` (character level, ChatML chat template like SmolLM2's), and the model a real
`LlamaForCausalLM` with a small `LlamaConfig`, so everything downstream runs the same code as for a hub model.
"""

from __future__ import annotations

import string

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
DEFAULT_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


def make_tokenizer(chars: str = DEFAULT_CHARS):
    """A character-level fast tokenizer with a ChatML chat template; `<|im_end|>` is EOS, `<pad>` is padding."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in dict.fromkeys(chars):
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # "[\s\S]", not ".": a run of newlines must still split into single characters.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "right"
    return tokenizer


def make_model(
    tokenizer,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 512,
    seed: int = 0,
):
    """A randomly initialised `LlamaForCausalLM` sized for `tokenizer`, seeded for reproducibility."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        attention_dropout=0.0,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
