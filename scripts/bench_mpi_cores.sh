#!/bin/bash
# Benchmark (not a test) of `mpirun -n N hils fidelity` on one machine of C cores against one
# process of C OpenMP threads (README, "Measured on 16 cores"): the unit cost at each length
# for 1..C threads (for scripts/simulate_schedule.py), the study's layers chosen so that one
# process takes ~TARGET seconds, then one process and N = RANKS with C/(N-1) threads per worker
# (rank 0 only coordinates), each results file compared with the one process's.
# usage: scripts/bench_mpi_cores.sh HILS MPIRUN [CORES]   (writes under /tmp/hils_bench_cores)
# env: LENGTHS (16384 32768 65536), TARGET (45 s), RANKS ("17 9 5 3" for 16 cores), PYTHON
set -uo pipefail
hils=$(realpath "$1") mpirun=$(command -v "$2") cores=${3:-$(nproc)}
py=${PYTHON:-python3}  # with h5py
here=$(cd "$(dirname "$0")" && pwd)
work=/tmp/hils_bench_cores; rm -rf "$work" && mkdir -p "$work" && cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lengths=(${LENGTHS:-16384 32768 65536})
TIMEFORMAT='%R %U %S'
# Runs "$@"; $last = "wall user sys" seconds; prints the command's errors, if any.
timed() {
  local rc
  { time "$@" > /dev/null 2> err.txt; } 2> time.txt; rc=$?
  last=$(tail -1 time.txt)
  if [ $rc -ne 0 ] || grep -q -v "^results:" err.txt; then echo "rc=$rc: $*"; head -c 2000 err.txt; fi
}
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A cost
threads=(1); for ((k = 2; k <= cores; k *= 2)); do threads+=($k); done
for k in "${threads[@]}"; do
  line="unit cost, $k threads:"
  for T in "${lengths[@]}"; do
    OMP_NUM_THREADS=$k timed "$hils" -q fidelity --lengths $T --n-layers 2 --queries 32 --out c.h5
    cost[$k,$T]=$(echo "$last" | awk '{printf "%.4f", $1 / 4}')  # 2 layers x 2 KV groups
    line+=" T=$T ${cost[$k,$T]} s"
    rm -f c.h5
  done
  echo "$line"
done
top=${threads[-1]}
per_layer=$(for T in "${lengths[@]}"; do echo "${cost[$top,$T]}"; done | awk '{s += 2 * $1} END {print s}')
layers=$(awk -v p="$per_layer" -v t="${TARGET:-45}" 'BEGIN{l = int(t / p); print (l < 16 ? 16 : (l > 64 ? 64 : l))}')
study=(fidelity --lengths "${lengths[@]}" --n-layers $layers --queries 32)
echo "study: hils ${study[*]} ($((${#lengths[@]} * layers * 2)) units)"
OMP_NUM_THREADS=$cores timed "$hils" -q "${study[@]}" --out one.h5
echo "one process, $cores threads: wall user sys = $last (load $(cut -d' ' -f1-3 /proc/loadavg))"
for n in ${RANKS:-17 9 5 3}; do
  th=$((cores / (n - 1)))
  timed "$mpirun" --oversubscribe --bind-to none -x OMP_NUM_THREADS=$th -n $n "$hils" -q "${study[@]}" --out n$n.h5
  echo "mpirun -n $n, $th threads per worker: wall user sys = $last (load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$py" "$here/../tests/experiments/compare_results.py" one.h5 n$n.h5 | tail -1
  costs=(); for T in "${lengths[@]}"; do costs+=(--cost "$T=${cost[$th,$T]:-${cost[1,$T]}}"); done
  "$py" "$here/simulate_schedule.py" "${costs[@]}" --layers $layers --groups 2 \
    --lengths "$(IFS=,; echo "${lengths[*]}")" --ranks $n | tail -1 | awk '{print "  simulated: " $2 " s"}'
  rm -f n$n.h5
done
