#!/bin/bash
# `mpirun -n N hils <study>` against one process (CTest, when MPI is built in):
#   same_results: fidelity, overlap, extrapolate under N = 2 or 3 give the one-process file's datasets
#                 and attributes bit for bit (provenance aside);
#   failing_rank: a layer with a NaN found late ends the job naming the rank and the unit, the
#                 file keeps its last checkpoint (again under N = 2), a layer that complete
#                 units read, changed since, is refused by its fingerprint, and after the fix
#                 the run resumes in one process to the same results;
#   run:          `hils run` over 3 layers x 2 mechanisms: the same, for its (mechanism, layer) units;
#                 rank 0 or a worker failing before the run ends the job in order, named;
#                 size checks count each rank's share of the node's memory;
#   interrupt:    Ctrl-C (SIGINT to mpirun) and SIGINT to rank 0 alone once the first unit is
#                 written: one line from rank 0 naming the file and its complete units, no
#                 temporary or lock file, and the file resumes to the uninterrupted datasets;
#                 the same for Ctrl-C with 2 units at once per worker (--jobs 2), and for
#                 SIGINT to such a worker alone (rank 0 prints the line, exit status 130);
#   hybrid:       --jobs N under mpirun (N units at once per worker rank): the one-process file
#                 under -n 2 --jobs 3 and -n 3 --jobs 2; a failing unit ends the job named, the
#                 checkpoint holding exactly the units before it; that checkpoint resumes in one
#                 process, and one process's checkpoint resumes under -n 2 --jobs 3; an
#                 OMP_NUM_THREADS that OpenMP ignores leaves the default --jobs as unset.
# usage: test_mpi.sh CASE HILS MPIRUN WORKDIR
set -euo pipefail
case_name=$1 hils=$2 mpirun=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
# CI runs as root; OpenMPI refuses that unless told twice.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { local n=$1; shift; "$mpirun" --oversubscribe -n "$n" "$hils" -q "$@"; }
same() { /usr/bin/python3 "$here/compare_results.py" "$1" "$2"; }
fail() { echo "FAIL: $*"; exit 1; }
# acts.h5: three layers of T slots copied from one synthetic layer (layer 1 differs in one entry),
# good.h5 a clean copy of it; poke L puts a NaN into one k entry of layer L.
three_layer_activations() {
  "$hils" -q dump synthetic -o acts.h5 -T "$1" --seed 7 --landmarks false
  /usr/bin/python3 - <<'PY'
import h5py
with h5py.File("acts.h5", "r+") as f:
    f.copy("layer0", "layer1")
    f.copy("layer0", "layer2")
    f["layer1/k"][0, 3, 0] = 0.25  # layers differ
    f.attrs["n_layers"] = 3
PY
  cp acts.h5 good.h5
}
poke() { /usr/bin/python3 -c "import h5py; f = h5py.File('acts.h5', 'r+'); f['layer$1/k'][1, 100, 2] = float('nan')"; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"

small=(--lengths 256 512 --n-layers 3 --queries 8 --mechanisms mean taylor_entropy)

if [[ $case_name == same_results ]]; then
  # W = 128 so that T = 256 and 512 have queries with retrieval candidates (fidelity refuses none).
  "$hils" -q fidelity --out fidelity_1.h5 "${small[@]}" --W 128
  mpi 2 fidelity --out fidelity_2.h5 "${small[@]}" --W 128
  mpi 3 fidelity --out fidelity_3.h5 "${small[@]}" --W 128
  same fidelity_1.h5 fidelity_2.h5 && same fidelity_1.h5 fidelity_3.h5
  "$hils" -q overlap --out overlap_1.h5 --lengths 256 512 --n-layers 2 --W 128
  mpi 3 overlap --out overlap_3.h5 --lengths 256 512 --n-layers 2 --W 128
  same overlap_1.h5 overlap_3.h5
  # Extrapolation runs several unit lists in turn (per encoding: fidelity, then needles).
  extra=(--lengths 256 512 --n-layers 1 --queries 4 --S 32 --W 128)
  "$hils" -q extrapolate --out extrapolate_1.h5 "${extra[@]}"
  mpi 3 extrapolate --out extrapolate_3.h5 "${extra[@]}"
  same extrapolate_1.h5 extrapolate_3.h5
  ranks=$(/usr/bin/python3 -c "import h5py; print(int(h5py.File('fidelity_3.h5')['/'].attrs['mpi_ranks']))")
  [[ $ranks == 3 ]] || fail "mpi_ranks attribute is $ranks, expected 3"
  echo "same results for N = 1, 2, 3"
  exit 0
fi

if [[ $case_name == hybrid ]]; then
  "$hils" -q fidelity --out fidelity_1.h5 "${small[@]}" --W 128
  mpi 2 fidelity --out fidelity_2x3.h5 "${small[@]}" --W 128 --jobs 3
  mpi 3 fidelity --out fidelity_3x2.h5 "${small[@]}" --W 128 --jobs 2
  same fidelity_1.h5 fidelity_2x3.h5 && same fidelity_1.h5 fidelity_3x2.h5
  "$hils" -q overlap --out overlap_1.h5 --lengths 256 512 --n-layers 2 --W 128
  mpi 3 overlap --out overlap_3x2.h5 --lengths 256 512 --n-layers 2 --W 128 --jobs 2
  same overlap_1.h5 overlap_3x2.h5

  # The default --jobs (--help shows rank 0's) under an OMP_NUM_THREADS that OpenMP ignores
  # (with a warning, using every core) is the default without it: the rank's share of its
  # node's cores. Before (audit, session 22) "", "0" and "four" counted as set: 2 here on 2
  # cores (each of 2 workers took both cores) against 1 without it.
  default_jobs() { env "$@" "$mpirun" --oversubscribe --bind-to none -n 3 "$hils" fidelity --help 2>/dev/null |
                     grep -o 'one per thread, [0-9]* here'; }
  unset_default=$(default_jobs -u OMP_NUM_THREADS)
  [[ -n $unset_default ]] || fail "fidelity --help under mpirun shows no default --jobs"
  for value in "" 0 four; do
    got=$(default_jobs OMP_NUM_THREADS="$value")
    [[ $got == "$unset_default" ]] || fail "OMP_NUM_THREADS='$value' under mpirun: '$got', expected '$unset_default' (as unset)"
  done

  # Three layers of T = 4096 (a unit computes for a while; a NaN is found as its layer is
  # read, at once).
  three_layer_activations 4096
  acts=(--source activations --activations acts.h5 --lengths 2048 4096 --n-layers 3 --queries 8
        --mechanisms mean taylor_entropy)
  "$hils" -q fidelity --out reference.h5 "${acts[@]}"
  holds() { /usr/bin/python3 - "$@" <<'PY' || fail "the checkpoint does not hold exactly the units before the failed one"
import h5py, json, sys
done = json.loads(h5py.File("resumed.h5", "r").attrs["complete_units"])
print("checkpoint holds", done)
assert sorted(done) == sorted(sys.argv[1:]), done
PY
  }
  # One worker with 3 units at once: it asks for T4096 layers 0, 1 and 2 (group 0 of each: one
  # load per layer), layer 2 fails at once while layers 0 and 1 compute; their group-1 units,
  # not yet handed out, come before the failed unit and are still computed and written.
  poke 2
  status=0; timeout 120 "$mpirun" --oversubscribe -n 2 "$hils" -q fidelity --out resumed.h5 \
    "${acts[@]}" --jobs 3 2> failure.txt || status=$?
  cat failure.txt
  [[ $status == 2 ]] || fail "a failing unit under --jobs 3: exit status $status, expected 2 (124: hung)"
  grep -q "bad input: rank 1 failed on unit T4096/layer2/group[01]: .*nan" failure.txt ||
    fail "the message does not name the rank, the unit and what was wrong"
  [[ $(grep -c "hils:" failure.txt) == 1 ]] || fail "expected one message (rank 0's), got: $(cat failure.txt)"
  [[ $(ls | grep -c "^resumed") == 1 ]] || fail "files besides resumed.h5: $(ls)"
  holds T4096/layer0/group0 T4096/layer0/group1 T4096/layer1/group0 T4096/layer1/group1
  # That checkpoint resumed in one process: the uninterrupted run's file.
  cp good.h5 acts.h5
  "$hils" -q fidelity --out resumed.h5 "${acts[@]}"
  same reference.h5 resumed.h5
  # One process's checkpoint (layer 1 broken: it keeps T4096 layer 0) resumed under -n 2
  # --jobs 3 (rank 0 hands out the units not complete, 10 of 12).
  rm resumed.h5 && poke 1
  if "$hils" -q fidelity --out resumed.h5 "${acts[@]}" --jobs 1 2> failure.txt; then
    fail "a NaN layer did not fail"
  fi
  holds T4096/layer0/group0 T4096/layer0/group1
  cp good.h5 acts.h5
  mpi 2 fidelity --out resumed.h5 "${acts[@]}" --jobs 3
  same reference.h5 resumed.h5
  echo "--jobs under mpirun: the one-process results; a failure named, the checkpoint exact; resumed across modes"
  exit 0
fi

if [[ $case_name == run ]]; then
  # Each rank runs in its own folder with its own copy of the activations, as ranks on cluster
  # nodes read node-local copies: a corrupt copy on the workers is bad input found late, in a
  # unit (rank 0 checks its own copy up front). The results file is ../run.h5 for every rank.
  "$hils" -q dump synthetic -o good.h5 -T 256 -S 16 --seed 5
  /usr/bin/python3 - <<'PY'
import h5py
with h5py.File("good.h5", "r+") as f:
    f.copy("layer0", "layer1")
    f.copy("layer0", "layer2")
    f["layer1/k"][0, 3, 0] = 0.25  # layers differ
    f["layer2/v"][1, 7, 2] = -0.5
    f.attrs["n_layers"] = 3
PY
  mkdir rank0 rank1 rank2
  copies() {  # copies BROKEN_LAYER: good copies, the workers' with a NaN in that layer
    for r in 0 1 2; do cp good.h5 rank$r/acts.h5; done
    [[ -z $1 ]] && return
    for r in 1 2; do
      /usr/bin/python3 -c "import h5py; h5py.File('rank$r/acts.h5', 'r+')['layer$1/k'][1, 9, 4] = float('nan')"
    done
  }
  at_rank() { local n=$1; shift
    "$mpirun" --oversubscribe -n "$n" bash -c 'cd rank$OMPI_COMM_WORLD_RANK && exec "$@"' _ "$hils" -q run acts.h5 "$@"; }
  run_args=(--preset full,hils -S 16 --landmarks true -W 32 -K 2)
  copies ""
  (cd rank0 && "$hils" -q run acts.h5 -o ../run_1.h5 "${run_args[@]}")
  at_rank 2 -o ../run_2.h5 "${run_args[@]}"
  at_rank 3 -o ../run_3.h5 "${run_args[@]}"
  same run_1.h5 run_2.h5 && same run_1.h5 run_3.h5
  ranks=$(/usr/bin/python3 -c "import h5py; print(int(h5py.File('run_3.h5')['/'].attrs['mpi_ranks']))")
  [[ $ranks == 3 ]] || fail "mpi_ranks attribute is $ranks, expected 3"

  # Units of one layer are consecutive; holds UNITS: the checkpoint holds exactly those.
  holds() { /usr/bin/python3 - "$@" <<'PY' || fail "the checkpoint does not hold the units before the failure"
import h5py, json, sys
done = json.loads(h5py.File("resumed.h5", "r").attrs["complete_units"])
print("checkpoint holds", done)
assert done == sys.argv[1:], done
PY
  }
  # Failures before the run starts end the job in order too (no MPI_Abort, whose teardown can
  # hang OpenMPI 4.1's mpirun; `timeout` turns such a hang into a failure here).
  # Rank 0's copy broken: its up-front validation fails while the workers wait for units.
  copies ""
  /usr/bin/python3 -c "import h5py; h5py.File('rank0/acts.h5', 'r+')['layer2/v'][0, 5, 1] = float('nan')"
  status=0; timeout 120 "$mpirun" --oversubscribe -n 3 bash -c 'cd rank$OMPI_COMM_WORLD_RANK && exec "$@"' \
    _ "$hils" -q run acts.h5 -o ../early.h5 "${run_args[@]}" 2> failure.txt || status=$?
  cat failure.txt
  [[ $status == 2 ]] || fail "rank 0 failing up front: exit status $status, expected 2 (124: hung)"
  grep -q "bad input: .*layer2/v.*nan" failure.txt || fail "rank 0's up-front failure not named"
  [[ $(grep -c "hils:" failure.txt) == 1 ]] || fail "expected one message (rank 0's), got: $(cat failure.txt)"
  [[ -z $(ls | grep "^early") ]] || fail "a results file was left: $(ls)"
  # A worker's copy missing: it fails before joining the run; rank 0's run names it.
  copies "" && rm rank2/acts.h5
  status=0; timeout 120 "$mpirun" --oversubscribe -n 3 bash -c 'cd rank$OMPI_COMM_WORLD_RANK && exec "$@"' \
    _ "$hils" -q run acts.h5 -o ../early.h5 "${run_args[@]}" 2> failure.txt || status=$?
  cat failure.txt
  [[ $status == 2 ]] || fail "a worker failing up front: exit status $status, expected 2 (124: hung)"
  grep -q "bad input: .*acts.h5" failure.txt || fail "the worker's own message is missing"
  grep -q "bad input: rank 2 ended before this run with exit status 2 (bad input: .*acts.h5" failure.txt ||
    fail "rank 0 does not name the worker that ended and why"
  [[ $(grep -c "hils:" failure.txt) == 1 ]] || fail "expected one message (rank 0's), got: $(cat failure.txt)"
  # Errors every rank finds (flags, a missing input): rank 0 alone prints them, once, and the
  # job's status is 2; no half-printed or interleaved lines.
  for bad in "fidelity --queries -1" "fidelity --lengths 100" "run missing.h5 -o x.h5" "run --bogus" \
             "fidelity --config missing.toml"; do
    status=0; timeout 120 "$mpirun" --oversubscribe -n 3 "$hils" $bad 2> failure.txt > /dev/null || status=$?
    [[ $status == 2 ]] || fail "mpirun -n 3 hils $bad: exit status $status, expected 2"
    [[ $(grep -c -e "hils:" -e "Run with --help" failure.txt) == 1 ]] ||
      fail "mpirun -n 3 hils $bad: expected one message (rank 0's), got: $(cat failure.txt)"
  done
  # Size checks count each rank's share of the node's memory (every rank may hold a unit at
  # once): a K that fits nowhere is refused naming the share, once, before any output.
  status=0; timeout 120 "$mpirun" --oversubscribe -n 3 "$hils" run good.h5 -o big.h5 \
    --preset hils -S 16 --landmarks true -K 1000000000000 2> failure.txt > /dev/null || status=$?
  cat failure.txt
  [[ $status == 2 ]] || fail "a unit beyond memory under mpirun -n 3: exit status $status, expected 2"
  grep -q "memory shared by 3 processes of this job (.* each)" failure.txt ||
    fail "the size check does not count the node's memory as shared by the 3 ranks"
  [[ $(grep -c "hils:" failure.txt) == 1 && ! -e big.h5 ]] || fail "expected one message, no file"
  # The other worker may have finished units meanwhile: a valid checkpoint of the first units.
  /usr/bin/python3 - <<'PY' || fail "early.h5 is not a checkpoint of the first units"
import h5py, json, os
if os.path.exists("early.h5"):
    done = json.loads(h5py.File("early.h5", "r").attrs["complete_units"])
    order = json.loads(h5py.File("run_1.h5", "r").attrs["complete_units"])
    print("checkpoint holds", done)
    assert done == order[:len(done)], (done, order)
PY
  [[ $(ls | grep -c "^early") -le 1 ]] || fail "files besides early.h5: $(ls)"
  rm -f early.h5

  # Interrupted under N = 3 (layer 1 broken on the workers) ...
  copies 1
  # mpirun's exit status is rank 0's: 2, bad input (the ranks end together, without MPI_Abort).
  status=0; at_rank 3 -o ../resumed.h5 "${run_args[@]}" 2> failure.txt || status=$?
  cat failure.txt
  [[ $status == 2 ]] || fail "exit status $status, expected 2 (bad input)"
  grep -q "bad input: rank [12] failed on unit [a-z]*/layer1: .*layer1/k.*nan" failure.txt ||
    fail "the message does not name the rank, the unit and what was wrong"
  [[ $(ls | grep -c "^resumed") == 1 ]] || fail "files besides resumed.h5: $(ls)"
  holds full/layer0 hils/layer0
  # ... resumed under N = 2 and interrupted again (layer 2 broken) ...
  copies 2
  status=0; at_rank 2 -o ../resumed.h5 "${run_args[@]}" --resume 2> failure.txt || status=$?
  [[ $status == 2 ]] || fail "exit status $status, expected 2 (bad input)"
  grep -q "bad input: rank 1 failed on unit full/layer2: .*nan" failure.txt || fail "second failure not named"
  holds full/layer0 hils/layer0 full/layer1 hils/layer1
  # ... and finished in one process: the same file as the uninterrupted run.
  copies ""
  (cd rank0 && "$hils" -q run acts.h5 -o ../resumed.h5 "${run_args[@]}" --resume)
  same run_1.h5 resumed.h5
  echo "hils run: same results for N = 1, 2, 3; failures named; resumed under N = 2 and 1"
  exit 0
fi

if [[ $case_name == interrupt ]]; then
  # Background jobs must not ignore SIGINT (bash sets SIG_IGN for them without job control).
  set -m
  # 97 small units (about 5 s on 2 cores): Ctrl-C reaches the ranks (as mpirun's SIGTERM) a
  # second after the first unit is written, with most of the run still to go. (With 8 layers,
  # 33 units, the rest of the run took about 1 s on 2 cores: it was often complete before the
  # SIGTERM came, failing 1 run in 3 with "ctrl_c.h5 keeps 33 units, expected 1..31".)
  args=(--lengths 2048 4096 --n-layers 24 --queries 16 --W 256)
  "$hils" -q fidelity --out whole.h5 "${args[@]}"
  # Starts `mpirun -n 3 hils fidelity --out $1`; once $1 exists (its first unit is written)
  # sends SIGINT to $2 (mpirun: what Ctrl-C in a terminal reaches, as each rank is a process
  # group of its own; rank0: the coordinator alone); sets `status`.
  interrupt() {
    rm -f "$1" err.txt
    timeout 120 "$mpirun" --oversubscribe -n "${ranks:-3}" "$hils" -q fidelity --out "$1" "${args[@]}" \
      ${jobs:+--jobs $jobs} 2> err.txt &
    local job=$! target
    while [[ ! -e $1 ]]; do kill -0 $job 2> /dev/null || fail "mpirun ended before $1 appeared"; sleep 0.005; done
    target=$(echo $(children $job))  # mpirun (or mpiexec) under timeout, spaces trimmed
    [[ -n $target ]] || fail "no mpirun process under timeout"
    if [[ $2 == rank0 || $2 == rank1 ]]; then
      for p in $(children "$target"); do
        grep -qz "^OMPI_COMM_WORLD_RANK=${2#rank}$" /proc/$p/environ 2> /dev/null && target=$p
      done
    fi
    kill -INT "$target"
    status=0; wait $job || status=$?
    cat err.txt
  }
  # The processes a process started (any of its threads), without procps's pgrep.
  children() { cat /proc/"$1"/task/*/children 2> /dev/null || true; }
  kept() { /usr/bin/python3 -c "import h5py, json; print(len(json.loads(h5py.File('$1', 'r').attrs['complete_units'])))"; }
  check_left() {  # FILE SIGNAL: rank 0's one line, the file whole and nothing beside it
    local n total; n=$(kept "$1") total=$(kept whole.h5)
    (( n >= 1 && n < total )) || fail "$1 keeps $n units, expected 1..$((total - 1))"
    grep -qx "hils: interrupted by $2: $1 keeps $n complete units\{0,1\} (work on unfinished units is dropped); run the same command again to continue from them" err.txt ||
      fail "rank 0's line is missing or wrong"
    [[ $(grep -c "hils:" err.txt) == 1 ]] || fail "expected one line (rank 0's), got: $(cat err.txt)"
    [[ $(ls -A | grep -c -e "\.tmp-" -e "\.lock") == 0 ]] || fail "left behind: $(ls -A)"
  }
  # Ctrl-C: mpirun sends every rank SIGTERM (about 1 s later, then SIGKILL 1 s after that:
  # OpenMPI's odls_base_sigkill_timeout) and exits 1 whatever the ranks do.
  interrupt ctrl_c.h5 mpirun
  [[ $status == 1 ]] || fail "mpirun after SIGINT: exit status $status, expected OpenMPI's 1"
  check_left ctrl_c.h5 SIGTERM
  # SIGINT to rank 0 alone: it stops at once, the workers end as they next ask for a unit, and
  # mpirun exits with rank 0's status, 130.
  interrupt rank0.h5 rank0
  [[ $status == 130 ]] || fail "SIGINT to rank 0: exit status $status, expected 130"
  check_left rank0.h5 "SIGINT (Ctrl-C)"
  # SIGINT to a worker alone, computing 2 units at once (mpirun -n 2 --jobs 2): its units stop,
  # it tells rank 0, which ends the run at the units written, prints the line and exits 130.
  ranks=2 jobs=2 interrupt worker.h5 rank1
  [[ $status == 130 ]] || fail "SIGINT to a worker with --jobs 2: exit status $status, expected 130"
  check_left worker.h5 "SIGINT (Ctrl-C)"
  # Ctrl-C with 2 units at once on one worker (mpirun -n 2 --jobs 2): the same as above.
  ranks=2 jobs=2 interrupt hybrid.h5 mpirun
  [[ $status == 1 ]] || fail "mpirun -n 2 --jobs 2 after SIGINT: exit status $status, expected OpenMPI's 1"
  check_left hybrid.h5 SIGTERM
  # All resume, under N = 2, in one process and under N = 3 with 2 units at once per worker,
  # to the uninterrupted run's datasets.
  mpi 2 fidelity --out ctrl_c.h5 "${args[@]}"
  "$hils" -q fidelity --out rank0.h5 "${args[@]}"
  mpi 3 fidelity --out hybrid.h5 "${args[@]}" --jobs 2
  "$hils" -q fidelity --out worker.h5 "${args[@]}"
  same whole.h5 ctrl_c.h5 && same whole.h5 rank0.h5 && same whole.h5 hybrid.h5 &&
    same whole.h5 worker.h5
  echo "interrupted under mpirun: one line from rank 0, the files resumed to the same results"
  exit 0
fi

[[ $case_name == failing_rank ]] || fail "unknown case $case_name"
# No landmark slots: the activation source's default geometry has none (S = 16, landmarks off).
three_layer_activations 512
acts=(--source activations --activations acts.h5 "${small[@]}")
"$hils" -q fidelity --out reference.h5 "${acts[@]}"

# Units go out largest first: T512 layers 0, 1, then layer 2 fails (with 2 workers, either
# group may be the one reported).
poke 2
if mpi 3 fidelity --out resumed.h5 "${acts[@]}" 2> failure.txt; then fail "a NaN layer did not fail"; fi
cat failure.txt
grep -q "bad input: rank [12] failed on unit T512/layer2/group[01]" failure.txt ||
  fail "the message does not name the rank and the unit"
grep -qi "nan" failure.txt || fail "the message does not say what was wrong"
# The last checkpoint is a valid results file, and no temporary file is left.
/usr/bin/python3 -c "import h5py; h5py.File('resumed.h5', 'r')" || fail "checkpoint unreadable"
[[ $(ls | grep -c "^resumed") == 1 ]] || fail "files besides resumed.h5: $(ls)"
# Whatever the timing, the checkpoint holds every unit scheduled before the failed layer 2.
/usr/bin/python3 - <<'PY' || fail "the checkpoint does not hold exactly the units before layer 2"
import h5py, json
done = set(json.loads(h5py.File("resumed.h5", "r").attrs["complete_units"]))
expected = {f"T512/layer{l}/group{g}" for l in (0, 1) for g in (0, 1)}
print("checkpoint holds", sorted(done))
assert done == expected, done
PY

# Resumed under N = 2 with layer 2 still broken: its first pending unit fails again, named.
if mpi 2 fidelity --out resumed.h5 "${acts[@]}" 2> failure.txt; then fail "a NaN layer did not fail"; fi
grep -q "bad input: rank 1 failed on unit T[0-9]*/layer2/group[01]: .*nan" failure.txt ||
  fail "second failure not named"
# Layer 2 fixed but layer 1, which complete units read, changed since (a NaN poked in): refused
# by its fingerprint on rank 0 before any unit, the checkpoint untouched.
cp good.h5 acts.h5 && poke 1
before=$(md5sum < resumed.h5)
if mpi 2 fidelity --out resumed.h5 "${acts[@]}" 2> failure.txt; then fail "a changed layer was resumed"; fi
grep -q "bad input: --activations (acts.h5) layer 1: expected the data that resumed.h5's complete units were computed from" failure.txt ||
  fail "the changed layer is not named: $(cat failure.txt)"
[[ $(md5sum < resumed.h5) == "$before" ]] || fail "the refused resume changed resumed.h5"

# Resumed in one process, without mpirun: the same results as the uninterrupted run.
cp good.h5 acts.h5
"$hils" -q fidelity --out resumed.h5 "${acts[@]}"
same reference.h5 resumed.h5
echo "failure named, checkpoint kept, resumed under N = 2 and 1 to the same results"

