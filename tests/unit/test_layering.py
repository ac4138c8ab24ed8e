"""The layers of docs/architecture.md, read from the source with :mod:`ast` (nothing is imported).

Two rules a newcomer can rely on, each a test:

* **What may import what** (:func:`test_layer_imports_only_what_its_layer_may`): the table core
  imports no engine, no ``pyspark``, no ``airflow`` and nothing of the test harness; the
  per-file kernels import the core only; the Arrow engine never imports the Spark package.
* **No import cycle** (:func:`test_no_import_cycle`) among the modules of ``spark_jobs`` and
  ``airflow_provider_bucketindex``.

What counts as an import, precisely:

* every ``import``/``from ... import`` statement anywhere in a module: at module level, inside a
  function or method, a class body, a ``try``/``except`` or an ``if``. A function-level import
  runs when the function is called, so it is as much a dependency (and as much a cycle) as one
  at the top of the file.
* ``from pkg import name`` depends on the module ``pkg.name`` when that is a module of ours
  (``from spark_jobs.kernels import tasks`` -> ``spark_jobs.kernels.tasks``), else on ``pkg``.
  ``import a.b.c`` depends on ``a.b.c``. Relative imports are resolved against the module.
* an import under ``if TYPE_CHECKING:`` (``typing.TYPE_CHECKING``) is never executed: it is
  **not a runtime edge** and does not count for cycles. It does count for the layer rules: a core
  annotation naming an engine's type would still tie the core to that engine.
* like import-linter (grimp), an import of ``a.b.c`` is not also counted as an import of the
  packages ``a`` and ``a.b`` whose ``__init__`` Python runs first: a package that re-exports its
  submodules would otherwise make every module below it a cycle.
* imports by name at run time (``importlib.import_module``, ``sys.modules``) are not statements
  and are not seen; the kernels read ``sys.modules["pyspark"]`` that way on purpose (a Spark
  task's worker has loaded it; the kernels never load it).
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass
from functools import lru_cache

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("spark_jobs", "airflow_provider_bucketindex")

#: the table core: timeline, commit, view, actions' rules, index, io, errors, fault points
CORE = ("spark_jobs.table", "spark_jobs.index", "spark_jobs.io", "spark_jobs.exceptions", "spark_jobs.redaction")
#: modules that import nothing of the project (checked below), so anything may import them
LEAVES = ("spark_jobs.redaction", "spark_jobs.text", "spark_jobs.processes", "spark_jobs.vocabulary")
KERNELS = ("spark_jobs.kernels",)
ARROW_ENGINE = ("spark_jobs.arrow_engine",)
SPARK_ENGINE = ("spark_jobs.jobs",)
#: outside packages no layer below the CLI and the provider may import
RUNTIMES = ("pyspark", "py4j", "airflow")
#: the test harness (tests/harness: torture, the S3 server, Delta readers) and the benchmarks
HARNESS = ("tests", "benchmarks", "conftest")
#: Airflow's calendar library: the core's clock is the standard library's, so a cold CLI
#: process or a Spark worker that loads the core does not pay for it
CALENDAR = ("pendulum",)


@dataclass(frozen=True)
class Layer:
    """A layer's modules and what they may import (``allowed`` of ours; ``denied`` of anything)."""

    name: str
    modules: tuple[str, ...]
    #: project modules this layer may import (None: any of ours not in ``denied``)
    allowed: tuple[str, ...] | None
    denied: tuple[str, ...]


LAYERS = (
    Layer("table core", CORE, allowed=CORE + LEAVES, denied=RUNTIMES + HARNESS + CALENDAR),
    Layer("kernels", KERNELS, allowed=CORE + LEAVES + KERNELS, denied=RUNTIMES + HARNESS),
    Layer("Arrow engine", ARROW_ENGINE, allowed=None,
          denied=SPARK_ENGINE + ("spark_jobs.engines", "spark_jobs.cli", "airflow_provider_bucketindex")
          + RUNTIMES + HARNESS),
    Layer("Spark engine", SPARK_ENGINE, allowed=None,
          denied=("spark_jobs.engines", "spark_jobs.cli", "airflow_provider_bucketindex", "airflow") + HARNESS),
    Layer("spark_jobs (all)", ("spark_jobs",), allowed=None,
          denied=("airflow_provider_bucketindex", "airflow") + HARNESS),
    Layer("Airflow provider", ("airflow_provider_bucketindex",), allowed=None, denied=HARNESS),
    Layer("leaves", LEAVES, allowed=(), denied=RUNTIMES + HARNESS),
)


@dataclass(frozen=True)
class Import:
    """One import statement's dependency: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int
    in_function: bool
    type_checking: bool

    def where(self) -> str:
        path = _modules()[self.source].relative_to(ROOT)
        return (f"{path}:{self.line} ({'inside a function' if self.in_function else 'module level'}"
                f"{', TYPE_CHECKING' if self.type_checking else ''})")


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@lru_cache(maxsize=1)
def _modules() -> dict[str, pathlib.Path]:
    """Every module of the installed packages, by dotted name (a package by its ``__init__``)."""
    out: dict[str, pathlib.Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@lru_cache(maxsize=None)
def _imports_of(module: str) -> tuple[Import, ...]:
    path = _modules()[module]
    ours = _modules()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[Import] = []

    def target_of(node: ast.ImportFrom, name: str) -> str:
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        return f"{mod}.{name}" if f"{mod}.{name}" in ours else mod

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            func = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, func, type_checking) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                found.extend(Import(module, target_of(child, a.name), child.lineno, func, type_checking)
                             for a in child.names)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), func, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), func, type_checking)
                continue
            visit(child, func, type_checking)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False, False)
    return tuple(found)


def _ours(target: str) -> str | None:
    """The module of ours ``target`` names (``a.b.Name`` -> ``a.b``), or None for an outside one."""
    while target and target not in _modules():
        target = target.rpartition(".")[0]
    return target or None


def _violations(layer: Layer) -> list[str]:
    out = []
    for module in _modules():
        if not _within(module, layer.modules):
            continue
        for imp in _imports_of(module):
            mine = _ours(imp.target)
            if _within(imp.target, layer.denied) or (mine is not None and _within(mine, layer.denied)):
                out.append(f"{imp.source} imports {imp.target} at {imp.where()}")
            elif mine is not None and layer.allowed is not None and not _within(mine, layer.allowed):
                out.append(f"{imp.source} imports {mine} (not in {layer.name}'s allowed layers) at {imp.where()}")
    return out


@pytest.mark.parametrize("layer", LAYERS, ids=[layer.name for layer in LAYERS])
def test_layer_imports_only_what_its_layer_may(layer: Layer) -> None:
    """docs/architecture.md "What may import what": each violation names the file and line."""
    assert [m for m in _modules() if _within(m, layer.modules)], f"no module in layer {layer.name}"
    problems = _violations(layer)
    assert not problems, f"{layer.name} breaks its import rule:\n  " + "\n  ".join(problems)


def test_the_scanner_sees_function_level_and_type_checking_imports() -> None:
    """The scanner's own rules, on modules that show each case (so the tests above cannot pass
    by not seeing an import): a function-level import, a TYPE_CHECKING one, ``from pkg import mod``."""
    # spark_jobs.jobs.session imports connect inside get_spark, pyspark at module level
    session = {(i.target, i.in_function) for i in _imports_of("spark_jobs.jobs.session")}
    assert ("spark_jobs.jobs.connect", True) in session and ("pyspark.sql", False) in session
    # a TYPE_CHECKING import is seen and marked
    schema = [i for i in _imports_of("spark_jobs.table.schema") if i.target == "spark_jobs.table.config"]
    assert schema and all(i.type_checking for i in schema)
    # ``from pkg import module`` is an edge to the module
    assert any(i.target == "spark_jobs.kernels.tasks" for i in _imports_of("spark_jobs.jobs.upsert"))


# -- cycles ----------------------------------------------------------------------------------

#: KNOWN cycle edges, allowed until they are broken: none left. The function-level imports by
#: which ``Table`` called its services and the services called each other (table.py <->
#: action/{rollback, clean, checkpoint, service}, service <-> rehash, table.py -> skew ->
#: action.compact) are gone: the timeline readers both need live in table.py, ``show``'s data
#: in table/describe.py, and rollback is ``action.rollback.rollback(table, ...)``. Keep it empty:
#: :func:`test_no_import_cycle` sets these edges aside and requires the rest of the graph to be
#: acyclic; :func:`test_allowed_cycle_edges_are_still_needed` fails for an edge that is gone.
ALLOWED_CYCLE_EDGES: frozenset[tuple[str, str]] = frozenset()


def _runtime_graph() -> dict[str, dict[str, Import]]:
    """module -> {module it imports at run time: the first such import statement}."""
    graph: dict[str, dict[str, Import]] = {m: {} for m in _modules()}
    for module in _modules():
        for imp in _imports_of(module):
            mine = _ours(imp.target)
            if imp.type_checking or mine is None or mine == module:
                continue
            graph[module].setdefault(mine, imp)
    return graph


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _a_cycle(graph: dict[str, dict[str, Import]], component: list[str]) -> list[Import]:
    """A shortest cycle through the component's first module, as its import statements."""
    start, members = component[0], set(component)
    paths: dict[str, list[Import]] = {start: []}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child, imp in sorted(graph[node].items()):
            if child not in members:
                continue
            if child == start:
                return paths[node] + [imp]
            if child not in paths:
                paths[child] = paths[node] + [imp]
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - a component has one


def _report(graph: dict[str, dict[str, Import]], components: list[list[str]]) -> str:
    lines = []
    for comp in components:
        lines.append(f"{len(comp)} modules in a cycle: {', '.join(comp)}; for example:")
        lines += [f"    {i.source} -> {_ours(i.target)}  ({i.where()})" for i in _a_cycle(graph, comp)]
    return "\n".join(lines)


def test_no_import_cycle() -> None:
    """Runtime imports (function-level included, TYPE_CHECKING excluded) form no cycle, once the
    known edges of :data:`ALLOWED_CYCLE_EDGES` are set aside. A failure prints each cycle as
    the import statements that make it."""
    graph = _runtime_graph()
    for source, target in ALLOWED_CYCLE_EDGES:
        graph.get(source, {}).pop(target, None)
    components = _strongly_connected(graph)
    assert not components, "import cycle(s):\n" + _report(graph, components)


def test_allowed_cycle_edges_are_still_needed() -> None:
    """The allow-list only shrinks: an allowed edge that no longer exists, or is no longer on a
    cycle, must be deleted from :data:`ALLOWED_CYCLE_EDGES` (a cycle broken stays broken)."""
    graph = _runtime_graph()
    in_cycle = {m: i for i, comp in enumerate(_strongly_connected(graph)) for m in comp}
    stale = sorted(e for e in ALLOWED_CYCLE_EDGES
                   if e[1] not in graph.get(e[0], {}) or in_cycle.get(e[0], -1) != in_cycle.get(e[1], -2))
    assert not stale, "delete from ALLOWED_CYCLE_EDGES (no longer an edge of a cycle):\n  " + "\n  ".join(
        f"{s} -> {t}" for s, t in stale)


def test_the_cycle_finder_reports_a_cycle() -> None:
    """The finder on the project's real graph with one function-level import added that closes
    a cycle (the timeline importing the table, which imports the timeline): it must find that
    cycle -- so a green :func:`test_no_import_cycle` is not a finder that finds nothing -- and
    its report names each edge's module, file and line."""
    graph = _runtime_graph()
    assert "spark_jobs.table.timeline" in graph["spark_jobs.table.table"]  # the edge the added one closes
    graph["spark_jobs.table.timeline"]["spark_jobs.table.table"] = Import(
        "spark_jobs.table.timeline", "spark_jobs.table.table", 7, in_function=True, type_checking=False)
    components = _strongly_connected(graph)
    assert any({"spark_jobs.table.table", "spark_jobs.table.timeline"} <= set(comp) for comp in components)
    report = _report(graph, components)
    assert "spark_jobs.table.timeline -> spark_jobs.table.table" in report and "timeline.py:7" in report


def test_the_cycle_finder_on_a_known_graph() -> None:
    """Tarjan and the shortest-cycle walk on a small graph: a -> b -> c -> a, d -> a, c -> e."""
    def edge(source: str, target: str) -> Import:
        return Import(source, target, 1, in_function=True, type_checking=False)

    graph = {"a": {"b": edge("a", "b")}, "b": {"c": edge("b", "c")},
             "c": {"a": edge("c", "a"), "e": edge("c", "e")}, "d": {"a": edge("d", "a")}, "e": {}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]
    assert [(i.source, i.target) for i in _a_cycle(graph, ["a", "b", "c"])] == [("a", "b"), ("b", "c"), ("c", "a")]
    del graph["c"]["a"]
    assert _strongly_connected(graph) == []


def _readme_layout() -> list[str]:
    """The paths README.md's "Project layout" block names, nesting by two-space indentation."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Project layout", 1)[1].split("```", 2)[1]
    paths: list[str] = []
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        stripped = line.lstrip(" ")
        head = stripped.split("  ", 1)[0].strip()
        if not head or not (head.endswith("/") or head.endswith(".py")):
            continue  # a continuation line of a description
        indent = len(line) - len(stripped)
        parents = [(i, p) for i, p in parents if i < indent]
        base = parents[-1][1] if parents else ""
        for name in (n.strip() for n in head.split(",")):
            paths.append(base + name)
        if head.endswith("/"):
            parents.append((indent, base + head))
    return paths


def test_the_readme_layout_matches_the_tree() -> None:
    """Every path the README's layout names exists, and it names every package of ``spark_jobs``
    and every directory of ``tests`` (the layers of docs/architecture.md)."""
    named = _readme_layout()
    assert "spark_jobs/kernels/" in named and "spark_jobs/table/action/" in named
    missing = [p for p in named if not (ROOT / p).exists()]
    assert not missing, f"README's layout names what is not in the tree: {missing}"
    packages = sorted(f"spark_jobs/{d.name}/" for d in (ROOT / "spark_jobs").iterdir()
                      if (d / "__init__.py").exists())
    unnamed = [p for p in packages if p not in named]
    assert not unnamed, f"README's layout does not name: {unnamed}"
    tests_dirs = sorted(d.name for d in (ROOT / "tests").iterdir() if d.is_dir() and not d.name.startswith((".", "_")))
    block = (ROOT / "README.md").read_text(encoding="utf-8").split("## Project layout", 1)[1].split("```", 2)[1]
    tests_line = next(line for line in block.splitlines() if line.startswith("tests/"))
    assert all(d in tests_line for d in tests_dirs), (tests_dirs, tests_line)
