"""Package import graph (subpackage level), cycles, and functions over 60 lines."""
import ast, sys, pathlib, itertools
root = pathlib.Path(sys.argv[1]) / "src/dflash_train"
edges = {}
long = []
def pkg_of(mod):
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]
for f in root.rglob("*.py"):
    rel = f.relative_to(root.parent).with_suffix("")
    mod = ".".join(rel.parts)
    if mod.endswith(".__init__"): mod = mod[:-9]
    src = pkg_of(mod) if "." in mod else mod
    tree = ast.parse(f.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".")
                if not f.name == "__init__.py": base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                full = ".".join(base + ([node.module] if node.module else []))
            else:
                full = node.module or ""
            names = [full]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for n in names:
            if n.startswith("dflash_train"):
                dst = pkg_of(n) if "." in n else "dflash_train"
                if dst != src:
                    edges.setdefault(src, set()).add(dst)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > 60: long.append((n, f"{f.relative_to(root.parent)}:{node.lineno} {node.name}"))
for k in sorted(edges): print(f"{k:12s} -> {', '.join(sorted(edges[k]))}")
# cycles via DFS
def cycles():
    found = set()
    def dfs(start, node, path):
        for nxt in edges.get(node, ()):
            if nxt == start: found.add(tuple(path))
            elif nxt not in path and nxt > start: dfs(start, nxt, path + [nxt])
    for s in edges: dfs(s, s, [s])
    return found
cs = cycles()
print("cycles:", [" -> ".join(c + (c[0],)) for c in sorted(cs)] or "none")
print("functions over 60 lines:")
for n, w in sorted(long, reverse=True): print(f"  {n:4d} {w}")
