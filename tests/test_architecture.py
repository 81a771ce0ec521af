"""The package's import structure, read statically from the source (nothing is imported).

What is checked, and why:

* the ``dca_theory`` modules import each other without a cycle (a cycle makes import order
  matter and forces lazy imports to paper over it);
* no module of ``dca_theory`` imports ``experiments`` or ``figures`` (under either name: the
  checkout's top-level packages or the wheel's ``dca_theory.experiments``): the core is a
  library those two use, never the reverse. The CLI alone loads them, by name, through
  :func:`dca_theory.cli.bundled`, the package's one dynamic import;
* ``experiments`` and ``figures`` import their own modules relatively, since a checkout runs
  them as top-level packages and the wheel as ``dca_theory.experiments`` / ``.figures``;
* ``dca_theory.lm`` never imports ``dca_theory.lab`` (the lab measures models; the model does
  not depend on its measurements);
* ``dca_theory.theory`` reaches no jax, equinox, optax or training code at import time, as its
  package docstring promises (``dca-theory figures`` and ``verify`` must start fast);
* no figure imports an experiment (figures read saved results and theory only).

Only module-level imports count for what is loaded at import time: an import inside a function
body runs when the function is called, so it is lazy by design. Imports under
``if TYPE_CHECKING:`` never run and are skipped too. Cycles are checked both ways: a lazy import
may defer loading, but it must not hide two modules that need each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = "dca_theory"
# Third-party roots and core packages that ``dca_theory.theory`` must never reach.
TRAINING_ROOTS = ("jax", "jaxlib", "equinox", "optax", "orbax", "jaxtyping")
TRAINING_PACKAGES = ("dca_theory.nets", "dca_theory.sim", "dca_theory.lm", "dca_theory.vit",
                     "dca_theory.lab")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(package: str) -> dict[str, Path]:
    """Every module of a top-level package folder, by dotted name."""
    return {module_name(p): p for p in sorted((REPO / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(body: list[ast.stmt]):
    """Import statements that run when the module runs: at top level or in module-level
    ``if`` / ``try`` / ``with`` blocks, never in a function or class body."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level_imports(node.body)
            yield from _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _module_level_imports(block)
        elif isinstance(node, ast.With):
            yield from _module_level_imports(node.body)


def _all_imports(tree: ast.Module):
    """Every import statement, lazy ones in function bodies included."""
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def imported_names(name: str, path: Path, known: set[str], *, lazy: bool = False) -> set[str]:
    """Dotted names a module imports at module level (with ``lazy``, in function bodies too).
    ``from a import b`` names ``a.b`` when that is a known module (a submodule), else ``a``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _all_imports(tree) if lazy else _module_level_imports(tree.body):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:  # relative: resolve against the importing module's package
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            out.add(sub if sub in known else base)
    return out


def import_graph(packages: tuple[str, ...] = (CORE,), *, lazy: bool = False) -> dict[str, set[str]]:
    """``{module: names it imports}`` over the given top-level packages (see
    :func:`imported_names`)."""
    modules: dict[str, Path] = {}
    for package in packages:
        modules |= source_modules(package)
    known = set(modules)
    return {name: imported_names(name, path, known, lazy=lazy) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the graph's own modules (first module repeated at the end), or
    None. Depth-first search with an explicit path."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root] & graph.keys()))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt] & graph.keys())))
    return None


def with_parents(name: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b, a.b.c]``: importing a module first runs its packages' inits."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def reachable(graph: dict[str, set[str]], roots) -> dict[str, str]:
    """Every name reached from ``roots`` at import time, mapped to the module that imports it
    (roots map to themselves)."""
    seen = {r: r for r in roots}
    todo = list(roots)
    while todo:
        mod = todo.pop()
        for imported in graph.get(mod, ()):
            for name in with_parents(imported):
                if name not in seen:
                    seen[name] = mod
                    todo.append(name)
    return seen


def import_chain(seen: dict[str, str], name: str) -> str:
    chain = [name]
    while seen[chain[-1]] != chain[-1]:
        chain.append(seen[chain[-1]])
    return " <- ".join(chain)


def test_core_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_core_package_has_no_cycle_hidden_by_a_lazy_import():
    """A function-body import that closes a cycle only hides it: the two modules still need
    each other. Break it with a module both can import instead."""
    cycle = find_cycle(import_graph(lazy=True))
    assert cycle is None, "import cycle (counting lazy imports): " + " -> ".join(cycle)


BUNDLED = ("experiments", "figures")
# What loads a module by a computed name; only the CLI's loader may (see below).
DYNAMIC_IMPORTS = ("import_module", "find_spec", "__import__", "spec_from_file_location")


def _names_bundled(name: str) -> bool:
    parts = name.split(".")
    return parts[0] in BUNDLED or parts[:1] == [CORE] and parts[1:2] in ([b] for b in BUNDLED)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_core_package_never_imports_experiments_or_figures():
    """Not at module level, not from a function body, under neither name."""
    bad = {f"{mod} imports {name}" for mod, names in import_graph(lazy=True).items()
           for name in names if _names_bundled(name)}
    assert not bad, sorted(bad)


def test_only_the_cli_loader_and_the_public_api_import_by_name():
    """``dca_theory.cli.bundled`` finds experiments and figures by name, the package's
    ``__init__`` loads its public names lazily from its own modules, and the LM zoo loads the
    mixer a scheme's registry row names (both checked below); no other module imports anything
    by a computed name, so none can reach experiments or figures."""
    bad = []
    for name, path in source_modules(CORE).items():
        if name in ("dca_theory.cli", CORE, "dca_theory.lm.zoo"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            attr = getattr(called, "attr", None) or getattr(called, "id", None)
            if attr in DYNAMIC_IMPORTS:
                bad.append(f"{name}:{node.lineno} calls {attr}")
    assert not bad, bad


def test_registry_rows_name_mixers_inside_the_zoo():
    from dca_theory import schemes

    paths = {s.name: s.mixer for s in schemes.SCHEMES if s.mixer}
    assert paths, "no scheme names a mixer"
    bad = {n: p for n, p in paths.items()
           if not p.startswith("dca_theory.lm.zoo.") or p.count(":") != 1}
    assert not bad, bad


def test_public_api_loads_only_core_modules():
    import dca_theory

    # a name whose home is the package itself is a sub-module exported under its own name
    loaded = {f"{CORE}.{n}" if home == CORE else home for n, home in dca_theory._PUBLIC.items()}
    bad = sorted(m for m in loaded if m not in source_modules(CORE) or _names_bundled(m))
    assert not bad, bad


def test_experiments_and_figures_import_their_own_modules_relatively():
    """They run under two names (``figures`` in a checkout, ``dca_theory.figures`` in the
    wheel): an absolute ``from figures import style`` would fail in the installed wheel."""
    bad = [f"{name} imports {imported}" for name, imported in _bundled_absolute_imports()]
    assert not bad, bad


def _bundled_absolute_imports():
    for package in BUNDLED:
        for name, path in source_modules(package).items():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    targets = [node.module or ""]
                else:
                    continue
                yield from ((name, t) for t in targets if _names_bundled(t))


def test_lm_never_imports_lab():
    """Not even lazily: ``dca_theory.lm`` is the model and its training; ``dca_theory.lab``
    measures it and may import it, never the reverse."""
    bad = {f"{mod} imports {name}" for mod, names in import_graph(lazy=True).items()
           for name in names
           if _within(mod, f"{CORE}.lm") and _within(name, f"{CORE}.lab")}
    assert not bad, sorted(bad)


def test_theory_docstring_promises_no_jax():
    import dca_theory.theory as theory

    assert "no jax" in " ".join(theory.__doc__.split()), "the promise tested below moved"


def test_theory_reaches_no_training_code_at_import():
    graph = import_graph()
    roots = [m for m in graph if m == "dca_theory.theory" or m.startswith("dca_theory.theory.")]
    seen = reachable(graph, roots)
    bad = [import_chain(seen, name) for name in sorted(seen)
           if name.split(".")[0] in TRAINING_ROOTS
           or any(name == p or name.startswith(p + ".") for p in TRAINING_PACKAGES)]
    assert not bad, "\n".join(bad)


def test_figures_import_no_experiment():
    graph = import_graph(("figures",))
    bad = {f"{mod} imports {name}" for mod, names in graph.items() for name in names
           if name.split(".")[0] == "experiments"}
    assert not bad, sorted(bad)


def test_figures_import_no_experiment_lazily_either():
    """Figures read saved results: not even a function body may load an experiment."""
    bad = []
    for name, path in source_modules("figures").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == \
                    "experiments" or isinstance(node, ast.Import) and any(
                        a.name.split(".")[0] == "experiments" for a in node.names):
                bad.append(f"{name}:{node.lineno}")
    assert not bad, bad


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "x": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_test_file_names_are_unique():
    """The test folders are not packages, so pytest imports each test file by its base name:
    two files of one name in different folders fail to collect."""
    import collections

    tests = Path(__file__).resolve().parent
    names = collections.Counter(p.name for p in tests.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
