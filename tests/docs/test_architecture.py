"""docs/ARCHITECTURE.md's list of layers (its ```layers block) against the code: every module of `elmo_tf/` and
`evaluation/` in exactly one layer, every import one its layer may make, no import circle, and the picture under
"The parts" naming the same layers.

Reads the sources with `ast`, imports nothing of them. Every import counts: at module level, inside functions, under
`if TYPE_CHECKING:`, and the module names a file hands to `importlib.import_module` as strings (the package's lazy
public names). An import names the module it reaches (`from elmo_tf.training import data` is an import of
`elmo_tf.training.data`; `from elmo_tf.training import Trainer` one of the package `elmo_tf.training`).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Optional

import pytest

from tests.doc_code import REPO, blocks

DOC = "docs/ARCHITECTURE.md"
TREES = ("elmo_tf", "evaluation")


@dataclasses.dataclass(frozen=True)
class Layer:
    name: str  # as the picture names the part: "text/", "errors.py"
    holds: tuple[str, ...]  # paths relative to the repository: a file, or a folder (ending in "/") and all below it
    may_import: tuple[str, ...]  # names of lower layers


def expand(path: str) -> list[str]:
    """`elmo_tf/{a,b}.py` -> `elmo_tf/a.py`, `elmo_tf/b.py` (one pair of braces, as the doc writes them)."""
    m = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", path)
    return [m[1] + part + m[3] for part in m[2].split(",")] if m else [path]


def parse_layers(text: str) -> list[Layer]:
    """The layers of a ```layers block, bottom-up: `NAME = PATH ... [-> LAYER ...]`, an indented line continuing the
    one above, `#` comments."""
    lines: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].rstrip()
        if line[:1].isspace() and lines:
            lines[-1] += " " + line.strip()
        elif line:
            lines.append(line)
    layers = []
    for line in lines:
        m = re.fullmatch(r"(\S+)\s*=\s*([^>]*?)\s*(?:->\s*(.*))?", line)
        assert m, f"{DOC}: cannot read the layer line {line!r} (NAME = PATH ... -> LAYER ...)"
        holds = tuple(p for path in m[2].split() for p in expand(path))
        layers.append(Layer(m[1], holds, tuple((m[3] or "").split())))
    return layers


def doc_layers() -> list[Layer]:
    found = [b for b in blocks(DOC) if b.language == "layers"]
    assert len(found) == 1, f"{DOC} has {len(found)} ```layers blocks, not 1"
    return parse_layers(found[0].code)


def source_modules() -> dict[str, str]:
    """{dotted module name: path relative to the repository} of every .py file under TREES."""
    modules = {}
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            name = rel[: -len(".py")].replace("/", ".")
            modules[name[: -len(".__init__")] if name.endswith(".__init__") else name] = rel
    return modules


def reached(name: str, modules: dict[str, str]) -> Optional[str]:
    """The module of TREES that importing `name` (a module, or a name in one) reaches, or None (another package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, rel: str, source: str, modules: dict[str, str]) -> dict[str, int]:
    """{imported module of `modules`: the first line importing it} of the module `name` (file `rel`, text `source`)."""
    tree = ast.parse(source, filename=rel)
    package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
    dynamic = any(isinstance(node, ast.Attribute) and node.attr == "import_module" or
                  isinstance(node, ast.Name) and node.id in ("import_module", "__import__") for node in ast.walk(tree))
    found: dict[str, int] = {}

    def add(target: Optional[str], line: int) -> None:
        if target is not None and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(reached(alias.name, modules), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else reached(base, modules), node.lineno)
        elif dynamic and isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            add(node.value, node.lineno)
    return found


def import_graph() -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    modules = source_modules()
    return modules, {name: imports_of(name, rel, (REPO / rel).read_text(encoding="utf-8"), modules)
                     for name, rel in modules.items()}


def circles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The groups of modules that import one another, directly or through others (strongly connected: Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def describe(group: frozenset[str], graph: dict[str, dict[str, int]], modules: dict[str, str]) -> str:
    """A shortest circle from the group's first module back to it, each import with its file and line; the group's
    other modules after it."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        if start in graph[v]:
            circle = paths[v] + [start]
            break
        for w in sorted(graph[v]):
            if w in group and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    text = " -> ".join(f"{a} ({modules[a]}:{graph[a][b]})" for a, b in zip(circle, circle[1:])) + f" -> {start}"
    others = sorted(group - set(circle))
    return text + (f"; in the same tangle: {', '.join(others)}" if others else "")


def layer_of(module_path: str, layers: list[Layer]) -> list[str]:
    """The names of the layers holding a source file (exactly one, when the list is right)."""
    return [layer.name for layer in layers
            if any(module_path == p or p.endswith("/") and module_path.startswith(p) for p in layer.holds)]


def placement_problems(layers: list[Layer], modules: dict[str, str]) -> list[str]:
    """Files in no layer or in several."""
    return [f"{rel} is in {layer_of(rel, layers) or 'no layer'}" for rel in modules.values()
            if len(layer_of(rel, layers)) != 1]


def import_problems(layers: list[Layer], modules: dict[str, str], graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports from one layer into another that the first may not import (files in one layer each)."""
    allowed = {layer.name: layer.may_import for layer in layers}
    layer = {name: layer_of(rel, layers)[0] for name, rel in modules.items()}
    return [f"{modules[a]}:{line} imports {b} ({layer[b]}); {layer[a]} may import "
            f"{' '.join(allowed[layer[a]]) or 'nothing'}"
            for a, targets in sorted(graph.items()) for b, line in targets.items()
            if layer[b] != layer[a] and layer[b] not in allowed[layer[a]]]


def test_the_layer_list_reads_bottom_up_and_names_what_exists():
    layers = doc_layers()
    names = [layer.name for layer in layers]
    assert len(names) == len(set(names)), names
    problems = []
    for i, layer in enumerate(layers):
        below = set(names[:i])
        problems += [f"{layer.name} may import {n}, which is not a layer below it" for n in layer.may_import
                     if n not in below]
        problems += [f"{layer.name} holds {p}, which does not exist" for p in layer.holds if not (REPO / p).exists()]
    assert not problems, "\n".join(problems)


def test_every_module_is_in_one_layer():
    modules = source_modules()
    assert len(modules) > 100 and "elmo_tf.training.trainer" in modules  # the trees were read
    problems = placement_problems(doc_layers(), modules)
    assert not problems, f"{DOC}, ```layers: every file in exactly one layer:\n" + "\n".join(problems)


def test_every_import_is_one_its_layer_may_make():
    modules, graph = import_graph()
    problems = import_problems(doc_layers(), modules, graph)
    assert not problems, f"imports that {DOC}'s ```layers block does not allow:\n" + "\n".join(problems)


def test_no_import_circle():
    """No module imports one that imports it back, directly or through others."""
    modules, graph = import_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(group, graph, modules) for group in found)


def test_the_picture_names_the_layers():
    """The picture under "The parts" names each layer of the list (a box's title, or a line's first word), and no
    other part."""
    doc = (REPO / DOC).read_text(encoding="utf-8")
    section = doc.split("\n## The parts\n", 1)[1].split("\n## ", 1)[0]
    picture = re.search(r"```\n(.*?)\n```", section, re.S)[1]
    named = set(re.findall(r"(?:^ |│ )([a-z_]+/|[a-z_]+\.py)(?= )", picture, re.M))
    assert named == {layer.name for layer in doc_layers()}


def test_the_checks_find_what_they_look_for():
    """The checks on a made-up tree: relative, TYPE_CHECKING and in-function imports, a name vs a module, strings
    handed to importlib; a circle of three with a fourth module in its tangle; a file in no layer; an import
    downwards that is not listed, and one upwards."""
    modules = {"p": "p/__init__.py", "p.a": "p/a.py", "p.b": "p/b.py", "p.c": "p/c.py", "p.d": "p/d.py",
               "p.e": "p/e.py", "q": "q.py"}
    sources = {
        "p/__init__.py": "",
        "p/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B\n",
        "p/b.py": "def f():\n    from . import c\n",
        "p/c.py": "import importlib\nimport numpy\nX = {'y': 'p.a'}\nimportlib.import_module(X['y'])\nimport p.e\n",
        "p/d.py": "from p import Name\nfrom .c import thing\n'p.a'\n",
        "p/e.py": "from p import b\n",
        "q.py": "import p.e\n",
    }
    graph = {name: imports_of(name, rel, sources[rel], modules) for name, rel in modules.items()}
    assert {k: sorted(v) for k, v in graph.items()} == {
        "p": [], "p.a": ["p.b"], "p.b": ["p.c"], "p.c": ["p.a", "p.e"], "p.d": ["p", "p.c"], "p.e": ["p.b"],
        "q": ["p.e"]}
    assert circles(graph) == [frozenset({"p.a", "p.b", "p.c", "p.e"})]
    assert describe(circles(graph)[0], graph, modules) == (
        "p.a (p/a.py:3) -> p.b (p/b.py:2) -> p.c (p/c.py:3) -> p.a; in the same tangle: p.e")
    layers = parse_layers("# c\nlow/ = p/{a,b}.py p/__init__.py\nmid/ = p/c.py p/e.py  # z\n  -> low/\nhigh/ = p/d.py")
    assert layers == [Layer("low/", ("p/a.py", "p/b.py", "p/__init__.py"), ()),
                      Layer("mid/", ("p/c.py", "p/e.py"), ("low/",)), Layer("high/", ("p/d.py",), ())]
    assert placement_problems(layers, modules) == ["q.py is in no layer"]
    del modules["q"], graph["q"]
    assert import_problems(layers, modules, graph) == [  # (p.a -> p.b: within a layer; p.c -> p.a: listed)
        "p/b.py:2 imports p.c (mid/); low/ may import nothing", "p/d.py:1 imports p (low/); high/ may import nothing",
        "p/d.py:2 imports p.c (mid/); high/ may import nothing"]
