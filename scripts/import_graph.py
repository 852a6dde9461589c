"""The package's import graph at subpackage level: its cycles, its upward arrows, the functions over 60 lines.

    python scripts/import_graph.py .        # from the repository root; `make lint` runs it

Exits 1 when the graph has a cycle, an upward arrow, or a subpackage that no layer names (issue 59).
Every import counts: module level, inside a function or a class, ``if TYPE_CHECKING:`` blocks, and a
string that names one of our modules (``importlib.import_module`` targets such as ``cli.COMMANDS`` or
``tracking/registry.py``'s backends, ``"dflash_train.x.y"`` or ``"dflash_train.x.y:Name"``). A node
is a subpackage (``dflash_train/train/``) or a top-level module (``dflash_train/config.py``).

The layers, bottom to top (:data:`LAYERS`; docs/spec.md section 7 says why this order). A package
may import only packages of a lower layer: an arrow to its own layer or above is an upward arrow.

A long function is where a reader gets lost: those are listed, not refused.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

LONG = 60
PACKAGE = "dflash_train"

# Bottom to top. Names on one line are peers: they import neither each other nor anything above.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the package's __init__ (every import of ours runs it: it imports none of them; arrows to it are not
    # counted), fault injection points (tests; the file helpers import them), the recipe files (data), the
    # engines' orphan guard (standard library only: run by path in another Python)
    (PACKAGE, "faultpoints", "recipes", "engine_guard"),
    ("files",),  # atomic writes, one-line file errors, checksums, read_text/read_json
    ("cli_types", "devices", "hf_compat", "engine_setup", "engine_process"),  # argparse types; torch devices; HF shims; engine installs and runs
    ("run_folder",),  # the run folder's names and its checkpoints' layout
    ("run_lock", "tracking"),  # one run per folder; where the metric records go (train.loggers backends)
    ("models",),  # the drafter, its kinds, the target wrapper
    ("objective", "assets"),  # the loss and its kinds; demo assets (tiny models)
    ("decoding",),  # speculative and plain decoding
    ("data",),  # data sets, tokenization, prompt sets and prompt files, decontamination
    ("features",),  # the feature store: its format, reader and writer (not the job that runs the target)
    ("llamacpp", "vllm"),  # the serving engines: pins, what each serves, installs, loader checks
    ("export",),  # the serving folder, GGUF
    ("eval",),  # acceptance evaluation: in process (training's held-out tau uses it) and through the engines
    ("config",),  # the job config and recipes
    ("config_reference",),  # the config keys' reference (docs/config.md, --help epilogs)
    ("config_cli",),  # dflash-train config
    ("train",),  # the trainer, its checkpoints, the train command
    ("distributed",),  # torchrun jobs: train across ranks, plan, the feature-store job (dflash-train features)
    ("bench",),  # benchmarks
    ("cli",),  # the dflash-train command: it registers every command module (by name)
)
LAYER_OF = {name: rank for rank, names in enumerate(LAYERS) for name in names}
MODULE_STRING = re.compile(rf"{PACKAGE}(\.\w+)+(:\w+)?")


def subpackage(module: str) -> str:
    """``dflash_train.train.loop`` -> ``train``; the package itself stays ``dflash_train``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: pathlib.Path, package_root: pathlib.Path) -> str:
    name = ".".join(path.relative_to(package_root.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def imported_modules(node: ast.AST, module: str, is_init: bool) -> list[str]:
    """The absolute names ``node`` imports (relative imports resolved against ``module``), or names as a
    string constant (a module imported by name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
        return [node.value.split(":")[0]]
    if not isinstance(node, ast.ImportFrom):
        return []
    if not node.level:
        source = node.module or ""
    else:
        base = module.split(".")
        if not is_init:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    # ``from dflash_train import files``: the names may be modules (scan keeps those that are)
    return [source] + [f"{source}.{alias.name}" for alias in node.names]


def scan(package_root: pathlib.Path) -> tuple[dict[str, dict[str, list[str]]], list[tuple[int, str]]]:
    """``edges[source][target]``: where ``source`` imports ``target`` (``path:line``); the long functions."""
    edges: dict[str, dict[str, list[str]]] = {}
    long_functions = []
    nodes = nodes_of(package_root)
    for path in sorted(package_root.rglob("*.py")):
        module = module_name(path, package_root)
        source = subpackage(module)
        where = path.relative_to(package_root.parent)
        for node in ast.walk(ast.parse(path.read_text())):
            for name in imported_modules(node, module, path.name == "__init__.py"):
                target = subpackage(name)
                if name.split(".")[0] == package_root.name and target in nodes and target not in (source, package_root.name):
                    found = edges.setdefault(source, {}).setdefault(target, [])
                    if f"{where}:{node.lineno}" not in found:
                        found.append(f"{where}:{node.lineno}")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONG:
                    long_functions.append((lines, f"{where}:{node.lineno} {node.name}"))
    return edges, long_functions


def cycles(edges) -> set[tuple[str, ...]]:
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


def unplaced(edges, nodes=(), layer_of=None) -> list[str]:
    """The nodes no layer names (a new subpackage must be given its place)."""
    layer_of = LAYER_OF if layer_of is None else layer_of
    names = set(nodes) | set(edges) | {t for targets in edges.values() for t in targets}
    return sorted(name for name in names if name not in layer_of)


def upward(edges, layer_of=None) -> list[tuple[str, str, list[str]]]:
    """``(source, target, where)`` for every arrow that does not point to a lower layer."""
    layer_of = LAYER_OF if layer_of is None else layer_of
    return [(source, target, where) for source in sorted(edges) for target, where in sorted(edges[source].items())
            if source in layer_of and target in layer_of and layer_of[target] >= layer_of[source]]


def nodes_of(package_root: pathlib.Path) -> set[str]:
    return {subpackage(module_name(path, package_root)) for path in package_root.rglob("*.py")}


def check(repo: pathlib.Path, layers=LAYERS, out=print) -> int:
    """Print the graph and what is wrong with it; the number of problems (0: none)."""
    package_root = repo / "src" / PACKAGE
    layer_of = {name: rank for rank, names in enumerate(layers) for name in names}
    edges, long_functions = scan(package_root)
    for source in sorted(edges):
        out(f"{source:12s} -> {', '.join(sorted(edges[source]))}")
    found = sorted(cycles(edges))
    out("cycles:", [" -> ".join(c + (c[0],)) for c in found] or "none")
    arrows = upward(edges, layer_of)
    out("upward arrows:", "none" if not arrows else "")
    for source, target, where in arrows:
        out(f"  {source} (layer {layer_of[source]}) -> {target} (layer {layer_of[target]}): {', '.join(where)}")
    missing = unplaced(edges, nodes_of(package_root), layer_of)
    if missing:
        out("in no layer (add them to LAYERS in scripts/import_graph.py):", ", ".join(missing))
    out(f"functions over {LONG} lines:")
    for lines, where in sorted(long_functions, reverse=True):
        out(f"  {lines:4d} {where}")
    problems = len(found) + len(arrows) + len(missing)
    out(f"import graph: {len(found)} cycles, {len(arrows)} upward arrows, {len(missing)} unplaced"
        + ("" if not problems else " -- FAIL"))
    return problems


def main() -> None:
    sys.exit(1 if check(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")) else 0)


if __name__ == "__main__":
    main()
