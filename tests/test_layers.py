"""The import graph of packtool/ against the layer order in packtool/__init__.py's docstring:
no package imports a package of a higher layer, and no two packages import each other
through any chain. Every ``import`` counts, at module level or inside a function (a lazy
import is an arrow all the same), relative ones resolved; ``importlib`` strings (the root
package's lazy names) are not imports."""

import ast
import functools
import re
from pathlib import Path

import packtool

ROOT = Path(packtool.__file__).parent


def _layers() -> list[list[str]]:
    """The order as the root docstring writes it: ``N  name name ...`` a layer, bottom first,
    continued on deeper-indented lines."""
    rows: list[list[str]] = []
    for line in packtool.__doc__.splitlines():
        if m := re.fullmatch(r"\s+(\d+)\s{2,}(\S.*)", line):
            assert int(m[1]) == len(rows), f"layer {m[1]} out of order in the table"
            rows.append(m[2].split())
        elif rows and (m := re.fullmatch(r"\s{7,}(\S.*)", line)):
            rows[-1] += m[1].split()
        elif rows:
            break
    assert rows, "packtool/__init__.py's docstring lost its layer table"
    return rows


def _package(mod: str) -> str:
    """The top-level unit of packtool a module belongs to (``packtool`` for the root)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "packtool"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(mod: str) -> bool:
    p = ROOT.parent.joinpath(*mod.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _statements(nodes):
    """Every statement, nested ones too (an import is a statement: no expression holds one)."""
    for node in nodes:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, field, None) or [])


@functools.cache
def imports() -> list[tuple[str, str, str]]:
    """(importing package, imported package, "file:line") for every import of packtool."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module(path)
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in _statements(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here[:len(here) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from packtool import errors` imports a module; `... import __version__` not
                targets = [f"{base}.{a.name}" if _exists(f"{base}.{a.name}") else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                if t == "packtool" or t.startswith("packtool."):
                    a, b = _package(mod), _package(t)
                    if a != b:
                        out.append((a, b, f"{path.relative_to(ROOT.parent)}:{node.lineno}"))
    return out


def test_every_package_has_a_layer():
    layer = {p for row in _layers() for p in row}
    units = {_package(_module(p)) for p in ROOT.rglob("*.py")}
    assert not units - layer, (f"{sorted(units - layer)}: not in the layer order of "
                               "packtool/__init__.py's docstring; add each where it belongs")


# arrows inside a layer that are wrong all the same
APART = {("verify", "pack"): "verify proves what pack wrote with its own code"}


def test_no_import_points_up():
    level = {p: i for i, row in enumerate(_layers()) for p in row}
    up = [f"{where}: {a} (layer {level[a]}) imports {b} (layer {level[b]})"
          for a, b, where in imports() if a in level and b in level and level[b] > level[a]]
    up += [f"{where}: {a} imports {b}: {APART[a, b]}" for a, b, where in imports()
           if (a, b) in APART]
    assert not up, "imports against the layer order:\n" + "\n".join(up)


def test_no_import_cycle_between_packages():
    edges: dict[str, dict[str, str]] = {}
    for a, b, where in imports():
        edges.setdefault(a, {}).setdefault(b, where)

    def path(src, dst, seen):  # a chain of imports src -> ... -> dst, as "file:line"s
        for nxt, where in edges.get(src, {}).items():
            if nxt == dst:
                return [where]
            if nxt not in seen:
                seen.add(nxt)
                rest = path(nxt, dst, seen)
                if rest:
                    return [where, *rest]
        return None

    cycles = [" -> ".join(c) for a in sorted(edges) if (c := path(a, a, set()))]
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_every_package_lists_its_modules():
    """Each package's docstring names each of its modules, so the list of what is where is
    one read away (a module added without a line there fails here)."""
    missing = []
    for init in sorted(ROOT.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for m in sorted(init.parent.iterdir()):
            name = m.stem if m.suffix == ".py" else m.name
            if name == "__init__" or name.startswith("__") or not (
                    m.suffix == ".py" or (m / "__init__.py").is_file()):
                continue
            if not re.search(rf"(?<![\w/]){re.escape(name)}\b", doc):
                missing.append(f"{init.relative_to(ROOT.parent)}: {name}")
    assert not missing, "modules a package's docstring does not list:\n" + "\n".join(missing)
