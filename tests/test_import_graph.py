"""The package's modules import each other without circles.

A circle (a imports b, b imports a, even lazily or under ``TYPE_CHECKING``) means two modules can
only be understood, tested and moved together, and a lazy import that hides one turns into an
``ImportError`` as soon as someone moves it to the top. Checked statically over every ``import``
statement of ``src/score_lightning``, wherever it sits in the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "score_lightning").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # "from pkg import module" names a module, else the attribute's module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_in_the_package():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_source_file_over_400_lines():
    """A reader follows one module in one sitting: split a longer one by responsibility."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}


def test_the_package_root_holds_at_most_14_modules():
    """Modules are grouped by layer (launch/, policy/, step/, rollout/ ...); the root keeps the few that
    every layer shares, so a newcomer finds "where is the model loaded" in a folder name."""
    root = sorted(p.name for p in (SRC / "score_lightning").glob("*.py"))
    assert len(root) <= 14, root
    layers = {p.name for p in (SRC / "score_lightning").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert {"launch", "policy", "step", "rollout", "roles", "rewards"} <= layers
