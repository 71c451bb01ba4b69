"""The malformed-data corpus shared by the data-layer tests and the `humanline data` command tests: every
file a user might hand us broken, with the one-line message each must give."""

from __future__ import annotations

from pathlib import Path

GOOD_PAIR = '{"prompt": "p", "chosen": "a", "rejected": "b"}'
GOOD_UNPAIRED = '{"prompt": "p", "completion": "a", "label": true}'
GOOD_GROUP = '{"prompt": "p", "completions": ["a", "b"], "scores": [1, 0]}'
GOOD_PROMPT = '{"prompt": "p", "answer": "1"}'
USER = '{"role": "user", "content": "hi"}'
BOT = '{"role": "assistant", "content": "yo"}'


def lines(*rows: str) -> str:
    return "".join(r + "\n" for r in rows)


# (file name, content, expected substring of the error: file:line, field and what was expected)
MALFORMED = [
    ("syntax.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": "a"'),
     "syntax.jsonl:2: invalid JSON: Expecting ',' delimiter (column 30)"),
    ("array_line.jsonl", lines(GOOD_PAIR, '["p", "a", "b"]'),
     "array_line.jsonl:2: expected a JSON object (one record), got a list"),
    ("no_chosen.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "rejected": "b"}'),
     "no_chosen.jsonl:2: field 'chosen': missing: a pairwise record needs 'prompt', 'chosen' and 'rejected'"),
    ("null_chosen.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": null, "rejected": "b"}'),
     "null_chosen.jsonl:2: field 'chosen': missing"),
    ("number_prompt.jsonl", lines(GOOD_PAIR, '{"prompt": 5, "chosen": "a", "rejected": "b"}'),
     "number_prompt.jsonl:2: field 'prompt': expected a string or a list of messages, got a number: 5"),
    ("empty_prompt.jsonl", lines(GOOD_PAIR, GOOD_PAIR, '{"prompt": "", "chosen": "a", "rejected": "b"}'),
     "empty_prompt.jsonl:3: field 'prompt': empty prompt"),
    ("empty_completion.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": "", "label": false}'),
     "empty_completion.jsonl:2: field 'completion': empty completion"),
    ("blank_completion.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": " \\n ", "label": false}'),
     "blank_completion.jsonl:2: field 'completion': empty completion"),
    ("same.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": "a", "rejected": "a"}'),
     "same.jsonl:2: field 'rejected': identical to 'chosen'"),
    ("label_text.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": "a", "label": "yes"}'),
     "label_text.jsonl:2: field 'label': expected true or false, got \"yes\""),
    ("no_label.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": "a"}'),
     "no_label.jsonl:2: field 'label': missing: an unpaired record needs"),
    ("nan.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b", "c"], "scores": [0.1, NaN, 2]}'),
     "nan.jsonl:2: field 'scores': expected a list of 3 finite numbers (one per completion), got [0.1, NaN, 2]"),
    ("inf.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": [Infinity, 0]}'),
     "inf.jsonl:2: field 'scores': expected a list of 2 finite numbers (one per completion), got [Infinity, 0]"),
    ("huge.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": [1' + "0" * 400 + ', 0]}'),
     "huge.jsonl:2: field 'scores': expected a list of 2 finite numbers"),
    ("short_scores.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b", "c"], "scores": [1, 0]}'),
     "short_scores.jsonl:2: field 'scores': expected a list of 3 finite numbers (one per completion), got [1, 0]"),
    ("bool_scores.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": [true, false]}'),
     "bool_scores.jsonl:2: field 'scores': expected a list of 2 finite numbers (one per completion), "
     "got [true, false]"),
    ("text_scores.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": ["1", "0"]}'),
     "text_scores.jsonl:2: field 'scores': expected a list of 2 finite numbers"),
    ("one.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a"], "scores": [1]}'),
     "one.jsonl:2: field 'completions': expected a list of at least 2 completions, got 1"),
    ("text_completions.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": "a b", "scores": [1]}'),
     "text_completions.jsonl:2: field 'completions': expected a list of at least 2 completions, got a string: \"a b\""),
    ("empty_member.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", ""], "scores": [1, 0]}'),
     "empty_member.jsonl:2: field 'completions[1]': empty completion"),
    ("armorm.jsonl", lines('{"prompt": "p", "all_generated_responses": ["a", "b", "c"], "all_rm_scores": [1, 2]}'),
     "armorm.jsonl:1: field 'all_rm_scores': expected a list of 3 finite numbers (one per completion), got [1, 2]"),
    ("role.jsonl", lines(GOOD_PAIR, '{"prompt": [{"role": "bot", "content": "hi"}], "chosen": "a", "rejected": "b"}'),
     "role.jsonl:2: field 'prompt[0].role': unknown role \"bot\" (expected one of assistant, developer, system, "
     "tool, user)"),
    ("no_content.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + '], "chosen": [{"role": "assistant"}], '
                                          '"rejected": "b"}'),
     "no_content.jsonl:2: field 'chosen[0]': message has no 'content' key (keys: role)"),
    ("list_content.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + ', {"role": "user", "content": ["x"]}], '
                                            '"chosen": "a", "rejected": "b"}'),
     "list_content.jsonl:2: field 'prompt[1].content': expected a string, got a list: [\"x\"]"),
    ("user_completion.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + '], "chosen": [' + BOT + '], '
                                               '"rejected": [' + USER + ']}'),
     "user_completion.jsonl:2: field 'rejected[0].role': a completion holds assistant messages only, got 'user'"),
    ("prompt_ends_assistant.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + ', ' + BOT + '], "chosen": "a", '
                                                     '"rejected": "b"}'),
     "prompt_ends_assistant.jsonl:2: field 'prompt[1].role': a prompt must end with a user or tool message, "
     "got 'assistant'"),
    ("empty_messages.jsonl", lines(GOOD_PAIR, '{"prompt": [], "chosen": "a", "rejected": "b"}'),
     "empty_messages.jsonl:2: field 'prompt': expected a string or a non-empty list of {'role', 'content'} messages"),
    ("message_text.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": ["a"], "label": true}'),
     "message_text.jsonl:2: field 'completion[0]': expected a message object with 'role' and 'content', got \"a\""),
    ("implicit.jsonl", lines('{"chosen": [' + BOT + '], "rejected": [{"role": "assistant", "content": "no"}]}'),
     "implicit.jsonl:1: field 'prompt': missing, and 'chosen' and 'rejected' share no leading prompt messages"),
    ("bad_id.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": "a", "rejected": "b", "prompt_id": [1]}'),
     "bad_id.jsonl:2: field 'prompt_id': expected a non-empty string or an integer id, got [1]"),
    ("answer.jsonl", lines(GOOD_PROMPT, '{"prompt": "p", "answer": {"x": 1}}'),
     "answer.jsonl:2: field 'answer': expected a string or a number, got an object: {\"x\": 1}"),
    ("metadata.jsonl", lines(GOOD_PROMPT, '{"prompt": "p", "metadata": "easy"}'),
     "metadata.jsonl:2: field 'metadata': expected an object, got a string: \"easy\""),
    # '{"prompt": "caf' is 15 bytes, so the Latin-1 e-acute is byte 16.
    ("latin1.jsonl", lines(GOOD_PAIR).encode() + b'{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}\n',
     "latin1.jsonl:2: not valid UTF-8 text (byte 16 of the line)"),
    ("empty.jsonl", "\n\n", "empty.jsonl: no records"),
    ("unknown.jsonl", lines('{"question": "q", "response": "r"}'),
     "unknown.jsonl:1: cannot tell the format from the columns (question, response)"),
    ("garbage.jsonl", lines("hello", "world"), "garbage.jsonl:1: cannot tell the format: no row is a JSON object"),
    ("syntax.json", '[\n  {"prompt": "p",\n   "chosen": "a" "rejected": "b"}\n]\n',
     "syntax.json:3: invalid JSON: Expecting ',' delimiter (column 18)"),
    ("scalar.json", "42", "scalar.json: expected a JSON list of records"),
    ("second.json", '[\n  {"prompt": "p", "chosen": "a", "rejected": "b"},\n\n  {"prompt": "q", "chosen": "a"}\n]',
     "second.json:4: field 'rejected': missing"),
    ("cells.csv", 'prompt,chosen,rejected\np,a,b\nq,a,b,c\n', "cells.csv:3: 1 more cells than the header has columns"),
    ("scores.csv", 'prompt,completions,scores\np,"[""a"", ""b""]","[1, 0"\n',
     "scores.csv:2: field 'scores': invalid JSON: Expecting ',' delimiter (column 6)"),
    ("label.csv", 'prompt,completion,label\np,a,true\nq,b,maybe\n',
     "label.csv:3: field 'label': expected true or false, got \"maybe\""),
    ("multiline.csv", 'prompt,chosen,rejected\n"line one\nline two",a,b\nq,"x",""\n',
     "multiline.csv:4: field 'rejected': empty completion"),
    ("dup.csv", "prompt,prompt,chosen,rejected\na,b,c,d\n", "dup.csv:1: the header repeats column(s) 'prompt'"),
    ("latin1.csv", b"prompt,chosen,rejected\np,a,b\ncaf\xe9,a,b\n", "latin1.csv:3: not valid UTF-8 text"),
    ("deep.jsonl", lines(GOOD_PAIR, '{"prompt": ' + "[" * 5000 + "]" * 5000 + "}"),
     "deep.jsonl:2: invalid JSON: nested too deeply"),
    # Deeper than any record format, shallower than any Python's parser recursion limit: the same message on
    # every Python version (3.12 parses the 5,000 levels above that 3.11 refuses).
    ("deep150.jsonl", lines(GOOD_PAIR, '{"prompt": ' + "[" * 150 + "]" * 150 + "}"),
     "deep150.jsonl:2: invalid JSON: nested too deeply (more than 100 levels)"),
    ("deep150.json", '[{"prompt": ' + "[" * 150 + "]" * 150 + ', "chosen": "a", "rejected": "b"}]',
     "deep150.json: invalid JSON: nested too deeply (more than 100 levels in a record)"),
    ("broken.parquet", b"PAR1 this is not parquet PAR1", "broken.parquet: cannot read Parquet"),
]


def _write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path
