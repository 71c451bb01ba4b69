"""Every config field with its default and meaning, read from the dataclasses' own source.

The settings types document each field once, next to its default: a trailing comment and the comment-only lines
right below it. `humanline config` prints them from there, so the listing can never disagree with the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import textwrap
import tokenize

from humanline.settings.config import Config


def field_docs(cls: type) -> dict[str, str]:
    """`{field: its comment}` of dataclass `cls` (an empty string for a field without one)."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, list[str]] = {}
    current = None  # the field whose comment is being read
    line_has_code: dict[int, bool] = {}
    tokens = list(tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline))
    for tok in tokens:
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            line_has_code[tok.start[0]] = True
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.string in names and \
                i + 1 < len(tokens) and tokens[i + 1].string == ":":
            current = tok.string
            docs[current] = []
        elif tok.type == tokenize.COMMENT and current is not None:
            docs[current].append(tok.string.lstrip("#").strip())
        elif tok.type == tokenize.NAME and line_has_code.get(tok.start[0]) and tok.start[1] == 4:
            current = None  # a method or other statement: no field's comment continues past it
    return {name: " ".join(docs.get(name, [])) for name in (f.name for f in dataclasses.fields(cls))}


WIDTH = 118


def listing(sections: list[str] | None = None) -> str:
    """Every field of `Config` as a YAML recipe of the defaults (it reads as `Config()`), each field's meaning
    as its comment, wrapped; only `sections` when given."""
    out = []
    defaults = Config()
    for section in dataclasses.fields(Config):
        if sections and section.name not in sections:
            continue
        block = getattr(defaults, section.name)
        docs = field_docs(type(block))
        out.append(f"{section.name}:")
        for name, doc in docs.items():
            value = json.dumps(dataclasses.asdict(block)[name])
            head = f"  {name}: {value}"
            if not doc:
                out.append(head)
                continue
            lines = textwrap.wrap(doc, WIDTH - len(head) - 4) or [""]
            out.append(f"{head}  # {lines[0]}")
            out += textwrap.wrap(" ".join(lines[1:]), WIDTH - 6, initial_indent="    # ", subsequent_indent="    # ")
    return "\n".join(out)
