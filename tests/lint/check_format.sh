#!/usr/bin/env bash
# Fails when clang-format (the tree's .clang-format) would change a C/C++/CUDA file of the
# tree, naming each file; `clang-format -i FILE` fixes it. Usage: check_format.sh SOURCE_DIR
set -u
cd "$1" || exit 2
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (scripts/install_deps.sh installs it)"; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cc' '*.h' '*.cu' '*.hpp' '*.c')
else
  mapfile -t files < <(find . -path ./build -prune -o -path ./.venv -prune -o \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.hpp' -o -name '*.c' \) -print | grep -v '^./build')
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check_format: clang-format would change %s\n' "${bad[@]}"
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not formatted (clang-format -i FILE)"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
