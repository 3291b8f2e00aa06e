#!/usr/bin/env python3
"""Checks that the folder tree is the layer map: no file includes a header of a layer above its
own (docs/architecture.md). Prints each violation and exits 1 when there is one.

  tools/check_layers.py [ROOT]            check (ROOT: the repository, default: this file's ../)
  tools/check_layers.py --graph [ROOT]    also print the include graph between folders

Layers, lowest first. A file may include headers of its own layer and of lower ones. The
bindings sit over the public C API only (include/mtxcomm and bindings/ itself): they never see
the library's internals. tests/ may include anything.
"""
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
    ("examples", 8),
    ("tests", 9),
]
NAMES = {0: "public API", 1: "base", 2: "transports", 3: "algorithms", 4: "gpu",
         5: "communicator", 6: "programs", 7: "bindings", 8: "examples", 9: "tests"}
# Headers that are generated into the build tree, and the folder they belong to.
GENERATED = {"mtxcomm_build_info.h": "lib/comm"}
SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


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
                bad.append(f"{src}: includes \"{inc}\" ({NAMES[theirs[1]]}); a binding uses the "
                           "public C API (include/mtxcomm) and bindings/ only")
            elif theirs[1] > own[1]:
                bad.append(f"{src} ({NAMES[own[1]]}, layer {own[1]}) includes \"{inc}\" "
                           f"({NAMES[theirs[1]]}, layer {theirs[1]}): a layer never includes one "
                           "above it")
    if graph:
        print("include graph between folders (count of #include lines):")
        for (a, b), n in sorted(edges.items()):
            if not a.startswith("tests"):
                print(f"  {a} -> {b}  ({n})")
    for b in bad:
        print("check_layers: " + b)
    if bad:
        print(f"check_layers: {len(bad)} include(s) against the layer order")
        return 1
    print(f"check_layers: {len(seen)} files, every include goes down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
