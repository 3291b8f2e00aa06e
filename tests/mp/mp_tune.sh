#!/usr/bin/env bash
# mtxcomm_bench --tune under mpirun writes a tuning file that MTXCOMM_TUNING_FILE loads; with it
# the benchmark's --predict column is the cost model's time; mtxcomm_info --topology prints the
# agreed node map. Usage: mp_tune.sh MPIEXEC MTXCOMM_BENCH MTXCOMM_INFO
set -euo pipefail
mpiexec=$1 bench=$2 info=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
file=$dir/tuning.json
timeout 120 "$mpiexec" -np 2 --oversubscribe "$bench" tune -o "$file" -m 8:16K | tee "$dir/tune.out"
grep -q '"format": "mtxcomm-tuning-1"' "$file" || { echo "FAIL: no tuning file"; exit 1; }
grep -q 'intra_node' "$dir/tune.out" || { echo "FAIL: no intra_node points"; exit 1; }
# A sweep of small sizes cannot pin a bandwidth term: every beta stays positive (the default
# where nothing large was measured), never 0, an infinitely fast link to the selector.
python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))
for level in ("intra_node", "inter_node"):
    assert t[level]["beta"] > 0 and t[level]["alpha"] > 0, (level, t[level])' "$file" \
  || { echo "FAIL: a beta or alpha of 0 in the tuning file"; exit 1; }
grep -q "inter_node: beta is the library's default" "$dir/tune.out" \
  || { echo "FAIL: the kept default beta is not said"; exit 1; }
MTXCOMM_TUNING_FILE=$file timeout 60 "$mpiexec" -np 2 --oversubscribe -x MTXCOMM_TUNING_FILE \
  "$bench" allreduce -m 1K:4K -c --predict -i 5 | tee "$dir/bench.out"
grep -q 'Predicted(us)' "$dir/bench.out" || { echo "FAIL: no Predicted column"; exit 1; }
grep -q '# Check: passed' "$dir/bench.out" || { echo "FAIL: check"; exit 1; }
echo '{"inter_node": {"beta": "slow"}}' > "$dir/bad.json"
if MTXCOMM_TUNING_FILE=$dir/bad.json "$info" > "$dir/bad.out" 2>&1; then
  echo "FAIL: a bad tuning file was accepted"; exit 1
fi
grep -q 'inter_node.beta' "$dir/bad.out" || { echo "FAIL: error does not name the key"; cat "$dir/bad.out"; exit 1; }
timeout 60 "$mpiexec" -np 3 --oversubscribe "$info" --topology | tee "$dir/topo.out"
grep -q 'agreed node map: 3 rank(s) on 1 node(s)' "$dir/topo.out" || { echo "FAIL: node map"; exit 1; }
echo "mp_tune: OK"
