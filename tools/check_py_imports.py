#!/usr/bin/env python3
"""Checks the imports inside the Python package python/mtxcomm: no module takes names from the
``__init__`` of a package it belongs to (it imports the module that defines them), and no two
modules import each other, directly or through others, not even from inside a function (a lazy
import only hides the cycle). Prints each violation and exits 1 when there is one.

  tools/check_py_imports.py [ROOT]            check (ROOT: the repository, default: this file's ../)
  tools/check_py_imports.py --graph [ROOT]    also print every module's imports within the package

A package's ``__init__`` may import its own modules (that is how it re-exports them); Python
runs the ``__init__`` of every enclosing package before a module, which is not counted as an
import. ALLOWED lists the imports that go up a layer on purpose, each with its reason.
"""
import ast
import os
import sys

# The compiled extension modules (bindings/python, bindings/tensorflow), counted as modules of
# the package also in a checkout where they are not built.
EXTENSIONS = ("mtxcomm._core", "mtxcomm.tensorflow._mtxcomm_tf")

# (importer, imported): deliberate imports of a higher layer, made inside a function.
ALLOWED = {
    # hvd.DistributedOptimizer(keras_optimizer) hands a Keras 3 optimizer to the keras
    # package's DistributedOptimizer (as horovod.tensorflow does), which builds on this module.
    ("mtxcomm.tensorflow.optimizer", "mtxcomm.tensorflow.keras"),
}


def modules(root):
    """{dotted name: path} of the package's Python modules and compiled extensions."""
    found = {name: "(compiled)" for name in EXTENSIONS}
    top = os.path.join(root, "python")
    for folder, _, files in os.walk(os.path.join(top, "mtxcomm")):
        for f in files:
            path = os.path.join(folder, f)
            if f.endswith(".py"):
                name = os.path.relpath(path, top)[:-3].replace(os.sep, ".")
                found[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
            elif f.endswith(".so"):
                name = os.path.relpath(os.path.join(folder, f.split(".")[0]), top)
                found[name.replace(os.sep, ".")] = path
    return found


def imports(name, path, known):
    """{imported module: [line numbers]} of one module, within the package."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = {}
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name
                while mod and mod not in known:
                    mod = mod.rpartition(".")[0]
                targets.append(mod)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = base + "." + alias.name
                targets.append(sub if sub in known else base)
        for t in targets:
            if t in known and t != name:
                out.setdefault(t, set()).add(node.lineno)
    return {t: sorted(lines) for t, lines in out.items()}


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(argv):
    show_graph = "--graph" in argv
    args = [a for a in argv if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    known = modules(root)
    graph = {name: imports(name, path, known) for name, path in known.items()
             if path.endswith(".py")}
    bad = 0
    for name, out in sorted(graph.items()):
        for target, lines in sorted(out.items()):
            if (name + ".").startswith(target + ".") and known[target].endswith("__init__.py"):
                print("%s imports the __init__ of its package %s (line %s): import the module "
                      "that defines the names" % (name, target, ", ".join(map(str, lines))))
                bad += 1
    kept = {name: [t for t in out if (name, t) not in ALLOWED] for name, out in graph.items()}
    for component in cycles(kept):
        print("import cycle: %s" % " <-> ".join(component))
        for a in component:
            for b in kept[a]:
                if b in component:
                    print("  %s imports %s (line %s)" % (a, b, ", ".join(map(str, graph[a][b]))))
        bad += 1
    if show_graph:
        for name, out in sorted(graph.items()):
            print("%s -> %s" % (name, ", ".join(sorted(out)) or "-"))
    if bad:
        print("%d violation(s)" % bad)
        return 1
    print("python/mtxcomm: %d modules, no import of an enclosing package's __init__, no cycle"
          % len(graph))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
