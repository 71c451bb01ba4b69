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
    """`{field: its comment}` of dataclass `cls` (an empty string for a field without one).

    A field's comment is the one on its line and the comment-only lines right below it; a comment-only block
    right above a field whose own line has no comment is that field's (written above it), not the previous
    field's continuation."""
    names = {f.name for f in dataclasses.fields(cls)}
    tokens = list(tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline))
    comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}
    statements = {t.start[0]: t.string for t in tokens if t.start[1] == 4 and t.type not in _LAYOUT}  # column 4
    fields = {line: name for line, name in statements.items() if name in names and
              any(t.start[0] == line and t.string == ":" for t in tokens)}
    docs: dict[str, list[str]] = {name: [] for name in names}
    current, pending = None, []  # the field being documented; comment-only lines not yet placed
    for line in sorted(set(comments) | set(statements)):
        if line in fields:
            name = fields[line]
            trailing = line in comments
            target = current if trailing else name  # a block with no comment on the next field's line: above it
            if target is not None:
                docs[target] += pending
            docs[name] += [comments[line]] if trailing else []
            current, pending = name, []
        elif line in statements:  # a method or other statement: no field's comment continues past it
            if current is not None:
                docs[current] += pending
            current, pending = None, []
        else:
            pending.append(comments[line])
    if current is not None:
        docs[current] += pending
    return {name: " ".join(docs[name]) for name in (f.name for f in dataclasses.fields(cls))}


_LAYOUT = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)


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
