"""The package's layout: no import cycles, and no module reads another object's private state.

Read from the source with ``ast``: every ``import`` of a gandiva module counts (those inside
functions too, which are how cycles hide), except under ``if TYPE_CHECKING``. Private state is
a name starting with one underscore that gandiva itself defines (``self._x = ...``, ``def
_x``); reading it through anything but ``self`` or ``cls`` reaches into another object. (Private
names of other libraries, e.g. ``os._exit`` or a framework's trainer internals, are not ours to
keep private.)
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gandiva"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = modules()


def imported(name: str, path: Path) -> set[str]:
    """The gandiva modules ``name`` imports (a ``from m import x`` counts ``m.x`` if it is a
    module, else ``m``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.add(full if full in MODULES else module)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in MODULES and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycles():
    graph = {name: imported(name, path) for name, path in MODULES.items()}
    assert cycles(graph) == []


def test_cycles_are_found_where_there_are_some():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@functools.cache
def own_private_names() -> frozenset[str]:
    names = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def private_reads(path: Path, private: frozenset[str], root: Path = PACKAGE.parent) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Attribute) and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr",
                                                                               "setattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in private):
            out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_reads_another_objects_private_state(name):
    assert private_reads(MODULES[name], own_private_names()) == []


def test_no_test_reads_private_state_of_gandiva():
    tests = Path(__file__).resolve().parent
    found = [r for path in sorted(tests.glob("*.py"))
             for r in private_reads(path, own_private_names(), root=tests.parent)]
    assert found == []


def test_a_read_of_another_objects_private_state_is_found(tmp_path):
    source = tmp_path / "gandiva" / "x.py"
    source.parent.mkdir()
    source.write_text("def f(p):\n    self._ok = p._book\n    return getattr(p, '_book')\n")
    found = private_reads(source, frozenset({"_book", "_ok"}), root=tmp_path)
    assert found == ["gandiva/x.py:2: p._book", "gandiva/x.py:3: getattr(p, '_book')"]
