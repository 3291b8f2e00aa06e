#!/usr/bin/env python3
"""Checks that the folder tree is the layer map: no file includes a header of a layer above its
own (docs/architecture.md). Prints each violation and exits 1 when there is one.

  tools/check_layers.py [ROOT]            check (ROOT: the repository, default: this file's ../)
  tools/check_layers.py --graph [ROOT]    also print the include graph between folders, and
                                          the import graph of the Python package

The Python package (python/mtxcomm) is held to layers of its own (PY_LAYERS): a module imports
modules of its own layer or lower ones, the framework packages (tensorflow, torch) never import
each other, the array API (_arrays) imports no framework, and the modules' imports, lazy ones
(inside a function) included, form no cycle (a submodule importing its package's __init__
makes one).

Layers, lowest first. A file may include headers of its own layer and of lower ones. The
bindings sit over the public C API only (include/mtxcomm and bindings/ itself): they never see
the library's internals. tests/ may include anything.
"""

import ast
import os
import re
import sys

# (folder prefix, layer). The longest matching prefix decides.
LAYERS = [
    ("include/mtxcomm", 0),
    ("lib/base", 1),
    ("transports", 2),
    ("algos", 3),
    ("gpu", 4),
    ("lib/comm", 5),
    ("tools", 6),
    ("bench", 6),
    ("gpu/bench", 6),
    ("bindings", 7),
    ("bindings/torch", 7),  # the C++ c10d backend: over the public C API and torch only
    ("examples", 8),
    ("tests", 9),
]
NAMES = {
    0: "public API",
    1: "base",
    2: "transports",
    3: "algorithms",
    4: "gpu",
    5: "communicator",
    6: "programs",
    7: "bindings",
    8: "examples",
    9: "tests",
}
# Headers that are generated into the build tree, and the folder they belong to.
GENERATED = {"mtxcomm_build_info.h": "lib/comm"}
SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh")
# Both forms: "x.h" and <x.h> (the repository root is on the include path, so <lib/...> would
# reach a repository header too); a header outside the repository resolves to None and is skipped.
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]', re.M)


def folder_of(path):
    return os.path.dirname(path) or "."


def layer_of(path):
    best = None
    for prefix, layer in LAYERS:
        if path == prefix or path.startswith(prefix + "/"):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return best


def resolve(root, src, inc):
    """The repository path of an include, or None for a header outside the repository."""
    if inc in GENERATED:
        return GENERATED[inc] + "/" + inc
    for cand in (inc, "include/" + inc, os.path.join(folder_of(src), inc)):
        cand = os.path.normpath(cand)
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def sources(root):
    for top in sorted({p for p, _ in LAYERS} | {"tests"}):
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for d, dirs, files in os.walk(base):
            dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "__pycache__")
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(d, f), root)


# The Python package's layers, lowest first: (module prefix, layer). The longest prefix decides.
PY_LAYERS = [
    ("mtxcomm._core", 0),  # the compiled extension
    ("mtxcomm._rank_env", 0),
    ("mtxcomm.common", 1),
    ("mtxcomm._errors", 2),
    ("mtxcomm._buffers", 2),
    ("mtxcomm._arrays", 2),
    ("mtxcomm.tensorflow", 3),
    ("mtxcomm.torch", 3),
    ("mtxcomm.transparent", 4),
    ("mtxcomm._transparent", 4),
    ("mtxcomm.run", 5),
    ("mtxcomm.bench_report", 5),
    ("mtxcomm", 5),  # the package's front: the array API and the exit handling, re-exported
]
PY_NAMES = {
    0: "extension",
    1: "shared",
    2: "array API",
    3: "framework binding",
    4: "transparent mode",
    5: "front and programs",
}
FRAMEWORKS = ("tensorflow", "torch", "jax", "keras")
EXTENSIONS = (  # compiled: no .py file
    "mtxcomm._core",
    "mtxcomm.tensorflow._mtxcomm_tf",
    "mtxcomm.torch._c10d",
)


def py_layer(module):
    best = None
    for prefix, layer in PY_LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return best


def py_modules(root):
    """{module name: (path, is_package)} of python/mtxcomm."""
    out = {}
    base = os.path.join(root, "python")
    for d, dirs, files in os.walk(os.path.join(base, "mtxcomm")):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "__pycache__")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(d, f), base)[:-3].split(os.sep)
            pkg = rel[-1] == "__init__"
            name = ".".join(rel[:-1] if pkg else rel)
            out[name] = (os.path.join(d, f), pkg)
    return out


def py_imports(path, name, is_pkg, modules):
    """(imported module, line, whether the import is the top level of a third-party package)
    for every import statement of the file, lazy ones included."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name if is_pkg else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.append((a.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                mod = ".".join(
                    parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                mod = node.module or ""
            for a in node.names:
                sub = mod + "." + a.name
                known = sub in modules or sub in EXTENSIONS
                found.append((sub if known else mod, node.lineno))
    return found


def check_python(root, graph):
    modules = py_modules(root)
    bad, edges = [], {}
    for name, (path, is_pkg) in sorted(modules.items()):
        rel = os.path.relpath(path, root)
        own = py_layer(name)
        for target, line in py_imports(path, name, is_pkg, modules):
            top = target.split(".")[0]
            if py_layer(name) and py_layer(name)[1] == 2 and top in FRAMEWORKS:
                bad.append(
                    f"{rel}:{line}: imports {target}; the array API imports no framework "
                    "(it finds a framework's module in sys.modules)"
                )
            if top != "mtxcomm":
                continue
            if target not in modules and target not in EXTENSIONS:
                # a name of a module (a function, a class): the module itself
                target = (
                    target.rpartition(".")[0] if target.rpartition(".")[0] in modules else target
                )
            if target == name:
                continue
            edges.setdefault(name, set()).add(target)
            theirs = py_layer(target)
            if own is None or theirs is None:
                continue
            if theirs[1] > own[1]:
                bad.append(
                    f"{rel}:{line} ({PY_NAMES[own[1]]}, layer {own[1]}) imports {target} "
                    f"({PY_NAMES[theirs[1]]}, layer {theirs[1]}): a layer never imports one "
                    "above it"
                )
            elif theirs[1] == own[1] == 3 and theirs[0] != own[0]:
                bad.append(
                    f"{rel}:{line}: imports {target}; one framework binding never imports another"
                )
    # Cycles: Tarjan's strongly connected components of the import graph.
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
                sccs.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        bad.append("import cycle between " + ", ".join(comp))
    if graph:
        print("import graph of the Python package (module -> modules it imports):")
        for v in sorted(edges):
            print(f"  {v} -> {', '.join(sorted(edges[v]))}")
    return bad, len(modules)


def main(argv):
    graph = "--graph" in argv
    args = [a for a in argv if a != "--graph"]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    bad = []
    edges = {}
    seen = set()
    for src in sources(root):
        if src in seen:
            continue
        seen.add(src)
        own = layer_of(src)
        if own is None:
            continue
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            target = resolve(root, src, inc)
            if target is None:
                continue
            theirs = layer_of(target)
            if theirs is None:
                continue
            a, b = folder_of(src), folder_of(target)
            if a != b:
                edges[(a, b)] = edges.get((a, b), 0) + 1
            if own[1] == 9:  # tests include anything
                continue
            if own[0] == "bindings" and theirs[1] not in (0, 7):
                bad.append(
                    f'{src}: includes "{inc}" ({NAMES[theirs[1]]}); a binding uses the '
                    "public C API (include/mtxcomm) and bindings/ only"
                )
            elif theirs[1] > own[1]:
                bad.append(
                    f'{src} ({NAMES[own[1]]}, layer {own[1]}) includes "{inc}" '
                    f"({NAMES[theirs[1]]}, layer {theirs[1]}): a layer never includes one "
                    "above it"
                )
    if graph:
        print("include graph between folders (count of #include lines):")
        for (a, b), n in sorted(edges.items()):
            if not a.startswith("tests"):
                print(f"  {a} -> {b}  ({n})")
    py_bad, py_count = check_python(root, graph)
    for b in bad + py_bad:
        print("check_layers: " + b)
    if bad or py_bad:
        print(
            f"check_layers: {len(bad)} include(s) and {len(py_bad)} Python import(s) against "
            "the layer order"
        )
        return 1
    print(
        f"check_layers: {len(seen)} C/C++ files, every include goes down the layers; "
        f"{py_count} Python modules, every import goes down the layers, no cycle"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
