"""The package's import graph at subpackage level, its cycles, and the functions over 60 lines.

    python scripts/import_graph.py .        # from the repository root

A map of the architecture should have no cycles between subpackages (issue 37's check), and long
functions are where a reader gets lost.
"""

import ast
import pathlib
import sys

LONG = 60


def subpackage(module: str) -> str:
    """``dflash_train.train.loop`` -> ``train``; the package itself stays ``dflash_train``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: pathlib.Path, package_root: pathlib.Path) -> str:
    name = ".".join(path.relative_to(package_root.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def imported_modules(node: ast.AST, module: str, is_init: bool) -> list[str]:
    """The absolute names ``node`` imports (relative imports resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if not node.level:
        return [node.module or ""]
    base = module.split(".")
    if not is_init:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return [".".join(base + ([node.module] if node.module else []))]


def scan(package_root: pathlib.Path) -> tuple[dict[str, set[str]], list[tuple[int, str]]]:
    edges: dict[str, set[str]] = {}
    long_functions = []
    for path in package_root.rglob("*.py"):
        module = module_name(path, package_root)
        source = subpackage(module)
        for node in ast.walk(ast.parse(path.read_text())):
            for name in imported_modules(node, module, path.name == "__init__.py"):
                if name.startswith("dflash_train") and (target := subpackage(name)) != source:
                    edges.setdefault(source, set()).add(target)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONG:
                    long_functions.append((lines, f"{path.relative_to(package_root.parent)}:{node.lineno} {node.name}"))
    return edges, long_functions


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every elementary cycle once, found from its smallest node."""
    found = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in edges.get(node, ()):
            if nxt == start:
                found.add(tuple(path))
            elif nxt not in path and nxt > start:
                walk(start, nxt, path + [nxt])

    for start in edges:
        walk(start, start, [start])
    return found


def main() -> None:
    edges, long_functions = scan(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "src/dflash_train")
    for source in sorted(edges):
        print(f"{source:12s} -> {', '.join(sorted(edges[source]))}")
    print("cycles:", [" -> ".join(c + (c[0],)) for c in sorted(cycles(edges))] or "none")
    print(f"functions over {LONG} lines:")
    for lines, where in sorted(long_functions, reverse=True):
        print(f"  {lines:4d} {where}")


if __name__ == "__main__":
    main()
