#!/usr/bin/env bash
# Installs the Debian packages mtxcomm builds and tests with, and ruff (the Python lint and
# format check, not packaged in Debian 12) into .venv-lint from PyPI. Idempotent: installs only
# what is missing. Run as root or with sudo available.
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF_VERSION=0.14.14

install_ruff() {
  if [ "$(.venv-lint/bin/ruff --version 2>/dev/null)" = "ruff $RUFF_VERSION" ]; then
    echo "install_deps: ruff $RUFF_VERSION present (.venv-lint)"
    return
  fi
  echo "install_deps: installing ruff $RUFF_VERSION into .venv-lint"
  python3 -m venv .venv-lint
  .venv-lint/bin/python -m pip install -q "ruff==$RUFF_VERSION"
}

pkgs=(cmake ninja-build g++ pkg-config
      openmpi-bin libopenmpi-dev
      libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
      libhwloc-dev libucx-dev libssl-dev
      python3-venv
      clang libclang-rt-dev clang-format cppcheck
      ccache     # scripts/build.sh, test_sanitizers.sh and setup_python.sh compile through it
      chromium)  # headless, for the test that screenshots mtxcomm_bench report's page

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all packages present"
  install_ruff
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_ruff
