#!/usr/bin/env bash
# The Python code under ruff (pyproject.toml [tool.ruff]). Usage: run_ruff.sh SOURCE_DIR check|format
#   check   ruff check: pycodestyle, pyflakes, import order, bugbear (`ruff check --fix` fixes some)
#   format  ruff format --check: fails naming each file `ruff format FILE` would change
# ruff comes from scripts/install_deps.sh (SOURCE_DIR/.venv-lint), else from PATH.
set -u
if [ $# -ne 2 ] || [ ! -d "$1" ]; then
  echo "usage: run_ruff.sh SOURCE_DIR check|format" >&2
  exit 2
fi
cd "$1" || exit 2
RUFF=.venv-lint/bin/ruff
[ -x "$RUFF" ] || RUFF=$(command -v ruff) || {
  echo "run_ruff: ruff is not installed (scripts/install_deps.sh puts it in .venv-lint)"
  exit 1
}
case "${2:-}" in
  check) exec "$RUFF" check --no-cache . ;;
  format) exec "$RUFF" format --no-cache --check . ;;
  *) echo "run_ruff: mode must be check or format, not '${2:-}'"; exit 2 ;;
esac
