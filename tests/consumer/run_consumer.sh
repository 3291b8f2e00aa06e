#!/usr/bin/env bash
# Installs the mtxcomm build tree into a temporary prefix and builds a downstream program
# against it twice: with CMake (find_package(mtxcomm), mtxcomm::mtxcomm) and with pkg-config.
# Runs the CMake-built one alone and, when MPIEXEC is given, under mpirun -np 2.
#
#   run_consumer.sh BUILD_DIR CMAKE C_COMPILER [MPIEXEC]
set -u

build_dir=$1 cmake=$2 cc=$3 mpiexec=${4:-}
src_dir=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for v in $(env | sed -n 's/^\(MTXCOMM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done

work=$(mktemp -d "${TMPDIR:-/tmp}/mtxcomm_consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

die() {
  echo "FAIL: $*"
  exit 1
}
step() { echo "=== $*"; }

step "install into $prefix"
"$cmake" --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 || {
  cat "$work/install.log"
  die "cmake --install"
}
find "$prefix" -type f -o -type l | sed "s|$prefix/||" | sort

step "configure and build the consumer with find_package(mtxcomm)"
"$cmake" -S "$src_dir" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || {
  cat "$work/configure.log"
  die "configuring the consumer"
}
"$cmake" --build "$work/build" >"$work/build.log" 2>&1 || {
  cat "$work/build.log"
  die "building the consumer"
}
grep -q "$prefix" "$work/build/CMakeCache.txt" || die "mtxcomm_DIR is not under the prefix"
grep '^mtxcomm_DIR' "$work/build/CMakeCache.txt"

step "run it alone"
out=$("$work/build/consumer" 2>&1)
rc=$?
echo "$out"
((rc == 0)) || die "the consumer exited with $rc"
grep -q "rank 0 of 1: .* allreduce ok" <<<"$out" || die "unexpected output"

if [[ -n $mpiexec ]]; then
  step "run it under mpirun -np 2"
  out=$(timeout 60 "$mpiexec" -np 2 --oversubscribe "$work/build/consumer" 2>&1)
  rc=$?
  echo "$out"
  ((rc == 0)) || die "mpirun exited with $rc"
  for r in 0 1; do
    grep -q "rank $r of 2: .* allreduce ok" <<<"$out" || die "rank $r did not report success"
  done
fi

step "build it with pkg-config"
pc=$(find "$prefix" -name mtxcomm.pc | head -n 1)
[[ -n $pc ]] || die "no mtxcomm.pc installed"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs mtxcomm) || die "pkg-config --cflags --libs mtxcomm"
echo "pkg-config --cflags --libs mtxcomm: $flags"
pkg-config --variable=prefix mtxcomm
case " $flags " in
  *" -I$prefix/"*) ;;
  *) die "the installed mtxcomm.pc does not point into its install prefix $prefix ($pc:" \
    "$(grep '^prefix=' "$pc")); cmake --install --prefix relocates everything but it" ;;
esac
# shellcheck disable=SC2086  # flags are words
"$cc" "$src_dir/main.c" $flags -o "$work/pc_consumer" || die "compiling with pkg-config flags"
libdir=$(pkg-config --variable=libdir mtxcomm)
out=$(LD_LIBRARY_PATH=$libdir "$work/pc_consumer" 2>&1)
rc=$?
echo "$out"
((rc == 0)) || die "the pkg-config consumer exited with $rc"
grep -q "rank 0 of 1: .* allreduce ok" <<<"$out" || die "unexpected output"
echo "PASS"
