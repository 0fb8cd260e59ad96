"""The design holds: no import cycle anywhere in packtool/, no private name imported from
another module (a private module's helpers included: what another module uses is public),
no function over 60 lines (issue 19); a module over 400 lines is a warning, never the reason
for a split (issue 38)."""

import ast
import warnings
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "packtool"


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def resolve(name: str, node: ast.ImportFrom, mods: dict) -> list[str]:
    """The packtool modules an ``from X import a, b`` names (a submodule if ``a`` is one)."""
    if node.level:
        base = name.split(".")
        if mods[name].name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("packtool"):
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in mods else target)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                edges[name] |= {t for t in resolve(name, node, mods) if t in mods}
            elif isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in mods}
        edges[name].discard(name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    """Module-level and function-level imports alike: a cycle hidden in a function is a
    design knot all the same. A package's ``__init__`` re-exporting its own submodules is
    not an edge back from them."""
    edges = graph()
    for pkg in [m for m, p in modules().items() if p.name == "__init__.py"]:
        for sub in [m for m in edges if m.startswith(pkg + ".")]:
            edges[sub].discard(pkg) if pkg in edges[sub] and sub in edges[pkg] else None
    found = cycles(edges)
    assert not found, f"import cycles: {found}"


def test_no_private_name_imported_across_modules():
    bad = []
    mods = modules()
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None and (
                    node.level or node.module.startswith("packtool")):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{name}: {a.name} from {node.module}")
    assert not bad, bad


def test_modules_and_functions_stay_small():
    big_modules, big_functions = [], []
    for name, path in modules().items():
        src = path.read_text()
        if len(src.splitlines()) > 400:
            big_modules.append(f"{name} ({len(src.splitlines())} lines)")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    big_functions.append(f"{name}.{node.name} ({n} lines)")
    if big_modules:  # a warning, never the reason for a split (issue 38): rooms by concept
        warnings.warn(f"modules over 400 lines: {big_modules}", stacklevel=1)
    assert not big_functions, big_functions


def test_public_names_are_the_same_whatever_was_imported_first():
    """A lazy public name must not share its name with a submodule (importing the submodule
    would replace it on the package)."""
    import packtool

    clash = [n for n, mod in packtool._LAZY.items() if (PKG / n).is_dir()
             or (PKG / f"{n}.py").is_file()]
    assert not clash, clash
