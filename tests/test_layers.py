"""The import graph of `src/humanline`: folders stacked in layers, no cycle, no import pointing up a layer or
across to a sibling folder of its layer, and an import inside a function only where it defers a heavy optional
dependency (and says so in a comment).

The graph is read from the source with `ast`: every `import` and `from ... import` of a humanline module, at the
top of a file, inside a function, or under `if TYPE_CHECKING:` (an import for annotations points down like any
other). `from humanline.data import convert` is an edge to the module `humanline.data.convert`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers_train import ROOT

SRC = ROOT / "src"

# Lowest first. A module belongs to the longest entry that is it or a package above it; it may import its own
# folder, or any folder of a lower layer (docs/design.md, its layers). The package itself (`humanline`, its
# public API) stands on top and names only what is below.
LAYERS = [
    ["humanline.errors", "humanline.version", "humanline.files", "humanline.hub", "humanline.core"],
    ["humanline.settings"],  # the config types: nothing above core
    ["humanline.objectives", "humanline.data", "humanline.devices"],
    ["humanline.model"],
    ["humanline.sampling", "humanline.integrations"],
    ["humanline.evaluation", "humanline.diagnostics"],
    ["humanline.training"],
    ["humanline.experiments.harness"],  # what the two experiments share
    ["humanline.experiments.demo", "humanline.experiments.reproduce", "humanline.experiments"],
    ["humanline.commands"],
    ["humanline.cli"],
    ["humanline.__main__", "humanline"],
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "humanline").rglob("*.py"))}


def entry(module: str) -> str | None:
    """The `LAYERS` entry that places `module` (the package `humanline` places only itself)."""
    names = [e for group in LAYERS for e in group
             if module == e or (e != "humanline" and module.startswith(e + "."))]
    return max(names, key=len) if names else None


def layer(module: str) -> int:
    return next(i for i, group in enumerate(LAYERS) if entry(module) in group)


def imports(module: str) -> list[tuple[str, int, bool]]:
    """`(imported humanline module, line, inside a function)` for each import of `module`."""
    tree = ast.parse(MODULES[module].read_text())
    in_function = {n.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        else:
            continue
        out += [(name, node.lineno, node.lineno in in_function) for name in names if name in MODULES]
    return out


GRAPH = {m: {name for name, _, _ in imports(m) if name != m} for m in MODULES}


def find_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    """A new top-level module needs a place: a folder of `LAYERS`, or an entry of its own."""
    assert [m for m in MODULES if entry(m) is None] == []


def test_the_package_imports_form_no_cycle():
    assert find_cycles() == []


def test_no_import_points_up_the_layers():
    upward = [f"{m} -> {name} (line {line})" for m in MODULES for name, line, _ in imports(m)
              if layer(name) > layer(m) and not name.startswith(m + ".")]
    assert upward == []


def test_folders_of_one_layer_do_not_import_each_other():
    across = [f"{m} -> {name} (line {line})" for m in MODULES for name, line, _ in imports(m)
              if layer(name) == layer(m) and entry(name) != entry(m) and "humanline" not in (entry(m), entry(name))]
    assert across == []


def test_no_humanline_import_hides_inside_a_function():
    """Imports of humanline modules belong at the top of the file: inside a function they hide cycles."""
    hidden = [f"{m} -> {name} (line {line})" for m in MODULES for name, line, inside in imports(m)
              if inside]
    assert hidden == []
