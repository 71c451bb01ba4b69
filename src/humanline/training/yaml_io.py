"""Strict YAML for recipes and `--section.key=value` overrides.

Differences from `yaml.safe_load`, each because a user was surprised without it:
- `1e-6` (no dot) and `1.0e6` (no exponent sign) are numbers, as in YAML 1.2 and every HF/TRL argument
  parser; PyYAML's YAML 1.1 resolver reads them as strings.
- A key given twice in one mapping is an error naming both lines (PyYAML silently keeps the last one).
- A file must be UTF-8 text, and nesting deeper than `MAX_DEPTH` is refused with one line instead of a
  `RecursionError` deep inside the parser.

Every failure raises a `UserError` whose one line starts with the file (and line, when known).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from humanline.errors import UserError

MAX_DEPTH = 32  # a recipe is two levels deep, a reward list four: anything past this is a damaged file

# Floats YAML 1.1 misses: an exponent without a dot before it or without a sign (`1e-6`, `5E3`, `1.0e6`).
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 exponent floats and duplicate-key detection."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *anchor` merges are allowed to repeat keys (that is their point)
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key; SafeConstructor reports it below
                    continue
                if first is not None:  # also on the same line: `{lr: 1, lr: 2}`
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}, first given on line {first + 1}", key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


def parse(text: str, source: str, *, lenient: bool = False) -> Any:
    """Parse YAML `text`; errors name `source` (a file, or an override such as `--optim.lr`).

    lenient: text that is not valid YAML is returned as the string it is (override values such as paths).
    """
    try:
        value = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise UserError(f"{source}: nested too deeply (more than {MAX_DEPTH} levels)") from None
    except yaml.YAMLError as exc:
        if lenient:
            return text
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        if isinstance(exc, yaml.reader.ReaderError):  # a control character: it knows its offset, not its line
            line = text[: exc.position].count("\n") + 1
        where = f"{source}:{line}" if line is not None else source
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise UserError(f"{where}: invalid YAML ({problem})") from exc
    check_depth(value, source)
    return value


def check_depth(value: Any, source: str) -> None:
    depth = _depth(value)
    if depth > MAX_DEPTH:
        raise UserError(f"{source}: nested too deeply (more than {MAX_DEPTH} levels)")


def read(path: str | Path) -> Any:
    """Read and parse a UTF-8 YAML file (a UTF-8 byte-order mark is allowed)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read config file ({exc.strerror or exc})") from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        hint = " (it starts with a UTF-16 byte-order mark)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise UserError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}){hint}; save the file as "
                        f"UTF-8") from None
    return parse(text, str(path))


def _depth(value: Any) -> int:
    """Nesting depth of lists and mappings, without recursion (a hostile file must not exhaust the stack).

    Aliases make shared subtrees: each is measured once (a "billion laughs" file stays linear), and an alias
    that contains itself counts as infinitely deep.
    """
    below: dict[int, int] = {}  # id of a container -> its depth, once measured
    stack: list[tuple[Any, bool]] = [(value, False)]
    open_ids: set[int] = set()
    while stack:
        item, done = stack.pop()
        children = list(item.values()) if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None or (not done and id(item) in below):
            continue
        if done:
            open_ids.discard(id(item))
            below[id(item)] = 1 + max((below.get(id(c), 0) for c in children), default=0)
            continue
        if id(item) in open_ids:
            return MAX_DEPTH + 1  # an alias inside itself
        open_ids.add(id(item))
        stack.append((item, True))
        stack.extend((c, False) for c in children if isinstance(c, (dict, list)))
        if len(open_ids) > MAX_DEPTH:
            return len(open_ids)
    return below.get(id(value), 0)
