#!/bin/bash
# Benchmark (not a test) of `mpirun -n N hils fidelity`: wall time at N = 1, 2, 3 on this
# machine, the per-unit cost at several lengths, and the dynamic schedule simulated on those
# costs for a 32-layer, 8-KV-group model at 16K-64K slots on up to 1,024 ranks.
# usage: scripts/bench_mpi.sh [BUILD_DIR]     (default build; writes under /tmp/hils_bench_mpi)
set -euo pipefail
build=${1:-build}
hils=$(cd "$build" && pwd)/bin/hils
here=$(cd "$(dirname "$0")" && pwd)
work=/tmp/hils_bench_mpi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Seconds the command took (wall clock).
wall() {
  /usr/bin/python3 -c 'import subprocess, sys, time
s = time.time(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(f"{time.time() - s:.2f}")' "$@"
}

study=(fidelity --lengths 1024 2048 4096 --n-layers 2 --queries 32)
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "study: hils ${study[*]} (synthetic, Hq 4, Hkv 2, d 64: 12 units)"
echo "N=1 (one process, $(nproc) OpenMP threads): $(wall "$hils" -q "${study[@]}" --out n1.h5) s"
echo "N=2 (rank 0 coordinates, 1 worker):        $(wall mpirun --oversubscribe -n 2 "$hils" -q "${study[@]}" --out n2.h5) s"
echo "N=3 (2 workers x 1 OpenMP thread):         $(wall mpirun --oversubscribe -x OMP_NUM_THREADS=1 -n 3 "$hils" -q "${study[@]}" --out n3.h5) s"

costs=()
for T in 1024 2048 4096 8192; do
  # One layer: Hkv = 2 units, plus the start-up (measured alone at the smallest length).
  t=$(wall "$hils" -q fidelity --lengths "$T" --n-layers 1 --queries 32 --out "unit_$T.h5")
  echo "T=$T: 2 units in $t s"
  costs+=(--cost "$T=$(/usr/bin/python3 -c "print($t / 2)")")
done
/usr/bin/python3 "$here/simulate_schedule.py" "${costs[@]}" --layers 32 --groups 8 \
  --lengths 16384,32768,65536
