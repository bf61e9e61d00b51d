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


def _layer(name: str) -> str:
    """``score_lightning.step.losses`` -> ``step``; a root module is its own name."""
    return name.split(".")[1] if name.count(".") >= 1 else name


def test_nothing_below_launch_imports_it():
    """``launch/`` composes a run: it may import every layer, and no layer imports it back (not even lazily),
    so the step, the callbacks, the rollout worker and the cold start can be built and tested without it."""
    modules = _modules()
    offenders = {}
    for name, path in modules.items():
        if name.startswith("score_lightning.launch"):
            continue
        up = sorted(m for m in _imports(path, modules) if m == "score_lightning.launch" or m.startswith("score_lightning.launch."))
        if up:
            offenders[name] = up
    assert offenders == {}


def test_clients_and_telemetry_import_only_the_root():
    """The clients of external services and the logging helpers sit below ``step/`` and every layer that calls
    them: they import nothing from the package but themselves and the shared root modules (``errors`` ...)."""
    modules = _modules()
    root = {m for m, p in modules.items() if m.count(".") == 1 and p.name != "__init__.py" and m != "score_lightning.module"}
    offenders = {}
    for name, path in modules.items():
        if _layer(name) not in ("clients", "telemetry"):
            continue
        bad = sorted(m for m in _imports(path, modules) if m not in root and _layer(m) != _layer(name)
                     and m != "score_lightning")
        if bad:
            offenders[name] = bad
    assert offenders == {}


def _package_graph(root: Path) -> dict[str, set[str]]:
    """First-level folders and root modules of the package at ``root`` as nodes; an edge for every import of one
    by another, relative ones resolved and those inside functions included (``/work/shared/tools/pkg_graph.py``'s
    graph, plus ``from score_lightning import protocol``, whose layer is the imported name)."""
    pkg_name = root.name

    def node(rel: Path) -> str:
        return rel.parts[0] if len(rel.parts) > 1 else rel.stem

    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        src, pkg = node(rel), rel.parent.parts
        graph.setdefault(src, set())
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                if n.level:  # from . import x / from ..y import z, resolved against the importing module's package
                    base = list(pkg[: len(pkg) - n.level + 1])
                    module = ".".join([pkg_name, *base] + ([n.module] if n.module else []))
                else:
                    module = n.module or ""
                # "from pkg import protocol" names the layer in the alias
                names = [f"{module}.{a.name}" for a in n.names] if module == pkg_name else [module]
            else:
                continue
            for m in names:
                parts = m.split(".")
                if parts[0] != pkg_name or len(parts) < 2:
                    continue
                dst = parts[1]
                if dst != src and ((root / dst).is_dir() or (root / f"{dst}.py").is_file()):
                    graph[src].add(dst)
    return graph


def test_the_package_graph_reads_relative_and_function_level_imports(tmp_path):
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", "errors.py": "",
                      "a/__init__.py": "", "a/x.py": "from ..b import y\n",
                      "b/__init__.py": "", "b/y.py": "def f():\n    import pkg.errors\n    from pkg.c.z import g\n",
                      "c/__init__.py": "", "c/z.py": "from . import w\nfrom .w import v\nimport os\n",
                      "c/w.py": "from pkg import a\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    graph = _package_graph(root)
    assert graph == {"__init__": set(), "errors": set(), "a": {"b"}, "b": {"errors", "c"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


#: the imports of a method that issue 70's plug-in registries replace (the lead removes the marks below once they
#: have landed): the circle methods -> rollout, sft, step -> methods
def test_the_package_graph_is_acyclic():
    """Layers (first-level folders and root modules) import each other one way only, even lazily: then a layer
    can be read, tested and replaced with the ones below it only."""
    assert _cycles(_package_graph(SRC / "score_lightning")) == []


#: the packages outside the core: the plug-ins themselves and those that compose or measure them
_NOT_CORE = ("methods", "evaluation", "sft", "launch")


def test_no_core_module_imports_a_method():
    """The core (the step, rollouts, roles, rewards, policy, harness, ...) looks a method up by the name a config
    key gives (``score_lightning.registry``), never by import, so a method is added or removed in its folder."""
    modules = _modules()
    offenders = {}
    for name, path in modules.items():
        if _layer(name) in _NOT_CORE:
            continue
        up = sorted(m for m in _imports(path, modules) if m.startswith("score_lightning.methods"))
        if up:
            offenders[name] = up
    assert offenders == {}


def test_evaluation_and_callbacks_are_imported_by_the_launch_only():
    """``evaluation/`` measures a run and ``callbacks/`` steer one; both sit above every layer the run is built
    from, so only ``launch/`` (and the scripts) compose them: a rubric source, a method or the cold start that
    needed one of them needs what it holds moved down (a file format to ``data/``, telemetry to ``telemetry/``)."""
    graph = _package_graph(SRC / "score_lightning")
    users = {dst: sorted(src for src, dsts in graph.items() if dst in dsts and src != "launch")
             for dst in ("evaluation", "callbacks")}
    assert users == {"evaluation": [], "callbacks": []}
