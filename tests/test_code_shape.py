"""The code's shape as the project keeps it: imports point down only (pipeline -> transforms ->
specdec_core, the engine without Beam), the engine's modules import no circle, and it stays small
enough to read (5,400 lines; no module of the engine, transforms or pipeline over 600)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE_LINES, MODULE_LINES = 5_400, 600


def _imports(path: Path) -> set[str]:
    """Modules a file imports (absolute names, relative ones resolved), at module level or inside functions,
    leaving out what only a type checker reads (the body of `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(ROOT).parent.parts
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
               for statement in node.body for n in ast.walk(statement)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] if node.level else ())
            module = ".".join(p for p in (base, node.module or "") if p)
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_imports_point_down_only():
    upward = {"specdec_core": ("apache_beam", "pipeline", "transforms"), "transforms": ("pipeline",)}
    found = [f"{path.relative_to(ROOT)} imports {name}"
             for package, banned in upward.items() for path in _files(package)
             for name in sorted(_imports(path)) if name.split(".")[0] in banned]
    assert not found


def test_the_engines_modules_import_no_circle():
    modules = {p.stem: p for p in _files("specdec_core") if p.stem != "__init__"}
    edges = {m: {n.split(".")[1] for n in _imports(p) if n.startswith("specdec_core.")} & modules.keys() - {m}
             for m, p in modules.items()}

    def circle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges[node]):
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    circles = [" -> ".join(c) for m in sorted(modules) if (c := circle_from(m))]
    assert not circles


def test_the_engine_stays_small_enough_to_read():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
             for package in ("specdec_core", "transforms", "pipeline") for p in _files(package)}
    assert sum(n for p, n in sizes.items() if p.startswith("specdec_core/")) <= CORE_LINES
    assert not {p: n for p, n in sizes.items() if n > MODULE_LINES}


def test_two_cache_classes():
    """One layout of row slots and one growing one (docs/how-it-works.md, "The caches"): the classes with the caches'
    interface (`forward`, `rollback`, `length`), the engine's classes they derive from, and any subclass of a
    transformers cache, two in all."""
    classes = {node.name: node for p in _files("specdec_core") for node in ast.walk(ast.parse(p.read_text()))
               if isinstance(node, ast.ClassDef)}
    bases = {name: {ast.unparse(b) for b in node.bases} for name, node in classes.items()}
    caches = {name for name, node in classes.items()
              if {"forward", "rollback", "length"} <= {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
              or bases[name] & {"Cache", "DynamicCache"}}
    while more := {b for name in caches for b in bases[name] if b in classes} - caches:
        caches |= more
    assert caches == {"BatchKV", "SlotKV"}
