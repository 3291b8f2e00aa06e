#!/usr/bin/env python3
"""No source file over 600 lines (C, C++, CUDA and Python: a file that big holds more than one
subject; split it by subject, as CONTRIBUTING says). Usage: check_file_sizes.py [ROOT]. Exit 0
when every file is within the limit, 1 naming each one over it."""

import os
import sys

LIMIT = 600
FOLDERS = (
    "algos",
    "bench",
    "bindings",
    "examples",
    "gpu",
    "include",
    "lib",
    "python",
    "tests",
    "tools",
    "transports",
)
EXT = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh", ".py")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(__file__, "..", ".."))
    over = []
    for top in FOLDERS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build", "__pycache__"))]
            for name in files:
                if name.endswith(EXT):
                    path = os.path.join(folder, name)
                    with open(path, "rb") as f:
                        lines = f.read().count(b"\n")
                    if lines > LIMIT:
                        over.append((lines, os.path.relpath(path, root)))
    for lines, path in sorted(over, reverse=True):
        print(
            "check_file_sizes: %s has %d lines (over %d): split it by subject"
            % (path, lines, LIMIT)
        )
    if not over:
        print("check_file_sizes: every source file has at most %d lines" % LIMIT)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
