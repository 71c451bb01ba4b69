"""Data: feedback formats, validation, conversion, tokenisation with chat templates and collation.

    from humanline.data import load_records, encode_pairs, collate_dpo
    result = load_records("prefs.jsonl")                         # PairRecords, every problem by file:line
    encoded = encode_pairs(result.records, tokenizer, max_prompt_length=256, max_length=512)
    batch = collate_dpo(encoded.units[:8], tokenizer.pad_token_id)   # (16, L): 8 chosen then 8 rejected
"""

from humanline.data.collate import collate_dpo, collate_grpo, collate_kto, pad_sequences
from humanline.data.convert import (
    groups_to_pairs,
    groups_to_unpaired,
    pairs_to_groups,
    pairs_to_unpaired,
    to_row,
    write_records,
)
from humanline.data.load import LoadResult, load_records, parse_rows, parse_split, split_records
from humanline.data.records import (
    KINDS,
    GroupRecord,
    Location,
    PairRecord,
    Problem,
    PromptRecord,
    UnpairedRecord,
    hash_prompt,
    kind_of,
    prompt_text,
)
from humanline.data.tokenization import (
    EncodeResult,
    encode_completion,
    encode_groups,
    encode_pairs,
    encode_prompt,
    encode_unpaired,
    fit_lengths,
    has_chat_template,
)

__all__ = [
    "KINDS",
    "EncodeResult",
    "GroupRecord",
    "LoadResult",
    "Location",
    "PairRecord",
    "Problem",
    "PromptRecord",
    "UnpairedRecord",
    "collate_dpo",
    "collate_grpo",
    "collate_kto",
    "encode_completion",
    "encode_groups",
    "encode_pairs",
    "encode_prompt",
    "encode_unpaired",
    "fit_lengths",
    "groups_to_pairs",
    "groups_to_unpaired",
    "hash_prompt",
    "has_chat_template",
    "kind_of",
    "load_records",
    "pad_sequences",
    "pairs_to_groups",
    "pairs_to_unpaired",
    "parse_rows",
    "parse_split",
    "prompt_text",
    "split_records",
    "to_row",
    "write_records",
]
