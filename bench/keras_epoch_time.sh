#!/usr/bin/env bash
# Seconds per epoch of the main job (examples/keras_digits.py, global batch 32) at np=1 (plain
# python) and np=2 (mtxrun --transparent), REPS runs each, interleaved; prints every run's
# median epoch time and the median over runs. Usage: bench/keras_epoch_time.sh [REPS] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
EPOCHS=${2:-10}
export TF_CPP_MIN_LOG_LEVEL=2
py=.venv/bin/python
one() { grep -o 'seconds per epoch: [0-9.]*' | awk '{print $4}'; }
declare -a t1 t2
for ((i = 0; i < REPS; i++)); do
  a=$("$py" examples/keras_digits.py --epochs "$EPOCHS" --verbose 0 | one)
  b=$(.venv/bin/mtxrun -np 2 --transparent "$py" examples/keras_digits.py --epochs "$EPOCHS" --verbose 0 | one)
  echo "run $i: np=1 ${a} s/epoch, np=2 ${b} s/epoch"
  t1+=("$a")
  t2+=("$b")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
echo "median: np=1 $(median "${t1[@]}") s/epoch, np=2 $(median "${t2[@]}") s/epoch"
