#!/usr/bin/env bash
# Builds and runs every GPU test, compute-sanitizer memcheck and the benchmark, on the device
# machine. Usage (repository root):
#   scripts/gpu_check.sh [--build-only] [--no-bench] [--quick] [--no-report] [--profile] [--python]
#                        [--decode] [--help]
# --help: prints this text (and runs nothing).
# --decode: only the decode step: its tests ("gpu decode*"), the `hils verify` dumps of one step
# (gpu/bench/dump_decode_verify.py), gpu/bench/bench_decode.py and compute-sanitizer memcheck of
# the tests (decode.log, decode.json in $OUT).
# --python: only the Python package as a GPU user installs it: the wheel with the library
# (`pip wheel -C cmake.define.HILS_BUILD_GPU=ON`: scikit-build-core compiles gpu/ with nvcc
# beside the module; no network, no build isolation) installed into a fresh venv
# ($HILS_GPU_BUILD/venv, which sees python3's own packages, torch among them), then, with
# HILS_GPU_LIB unset (the library found in the installed package), the GPU pytests
# tests/python/test_gpu_kernels.py, test_gpu_forward.py, test_gpu_decode.py, test_gpu_backward.py
# and test_gpu_module.py with test_decode_kernel_names.py; logs in $OUT. Needs nothing of
# --build-only.
# --quick: ctest only (no second full test report, no memcheck); --no-report: no second plain
# run of the test binary, the tensor report is read from the memcheck run; --profile: Nsight Compute on the
# window, select and fuse kernels at T = HILS_PROFILE_T (default 131072) into ncu.log.
# Environment: OUT (logs land there, default ./out/gpu_check), HILS_DEPS (a folder holding
# eigen3/, catch2/ and cmake/ when the machine lacks Eigen or Catch2; default .device/deps),
# HILS_BENCH_MAX_T (longest benchmark length, default 524288), HILS_GPU_BUILD (build folder,
# default build-gpu-check), HILS_CUDA_ARCHITECTURES (default 90a, which the wgmma kernels need; with
# another value those kernels are refused at run time and the defaults fall back, README "GPU").
#
# It configures the project's own CMakeLists with HILS_BUILD_ANALYSIS/EXPERIMENTS/PYTHON off
# (reference + oracle + gpu/ + tests), so that the device machine needs only Eigen, OpenMP,
# Catch2 and nvcc: no Boost, HDF5 or CLI packages.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/out/gpu_check}"
DEPS="${HILS_DEPS:-$ROOT/.device/deps}"
BUILD="${HILS_GPU_BUILD:-$ROOT/build-gpu-check}"
BUILD_ONLY=0
BENCH=1
QUICK=0
NO_REPORT=0
PROFILE=0
PYTHON=0
DECODE=0
for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    --build-only) BUILD_ONLY=1 ;;
    --no-bench) BENCH=0 ;;
    --quick) QUICK=1 ;;
    --no-report) NO_REPORT=1 ;;
    --profile) PROFILE=1 ;;
    --python) PYTHON=1 ;;
    --decode) DECODE=1 ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (expected --build-only, --no-bench, --quick, --no-report, --profile, --python, --decode or --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT" "$BUILD"
OUT="$(cd "$OUT" && pwd)" BUILD="$(cd "$BUILD" && pwd)"  # --python runs its tests from $OUT
if [ "$PYTHON" = 1 ]; then
  # Eigen and nlohmann-json from $DEPS when carried (see gpu/NOTES.md), pybind11 and
  # scikit-build-core from python3's own packages (--no-build-isolation: no network).
  # The module and the .cu files' host code are compiled by the system g++ (the compiler Python
  # was built with): the GPU machine's CXX=/opt/gcc/bin/g++ wrapper links libstdc++ statically,
  # and a module carrying its own libstdc++ inside a process that already loaded libstdc++.so.6
  # (numpy, torch) crashed in its first std::ostringstream (measured: SEGV in hils::describe,
  # ldd showed no libstdc++.so.6).
  [ -x /usr/bin/g++ ] && export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
  export CUDACXX="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
  # A fresh venv; python3's own site-packages (torch, pytest, pybind11, scikit-build-core) come
  # after the venv's through a .pth file (python3 may itself be a venv, whose packages
  # --system-site-packages would not reach), so the installed hils is the one imported.
  VENV="$BUILD/venv"
  rm -rf "$VENV" "$BUILD/dist"
  python3 -m venv "$VENV" >"$OUT/venv.log" 2>&1 || { cat "$OUT/venv.log"; exit 3; }
  PY="$VENV/bin/python"
  python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
    >"$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/base_site.pth"
  PIP_ARGS=(--no-build-isolation --no-deps -C cmake.define.HILS_BUILD_GPU=ON
            -C "cmake.define.HILS_CUDA_ARCHITECTURES=${HILS_CUDA_ARCHITECTURES:-90a}"
            -C "cmake.define.pybind11_DIR=$("$PY" -m pybind11 --cmakedir)")
  [ -d "$DEPS/include" ] && PIP_ARGS+=(-C "cmake.define.CMAKE_PREFIX_PATH=$DEPS"
                                       -C "cmake.define.Eigen3_DIR=$DEPS/share/eigen3/cmake")
  echo "== pip wheel -C cmake.define.HILS_BUILD_GPU=ON (hils with libhils_gpu_c.so), into $VENV"
  start=$SECONDS
  "$PY" -m pip wheel -v -w "$BUILD/dist" "${PIP_ARGS[@]}" "$ROOT" >"$OUT/pip.log" 2>&1 \
    || { tail -n 20 "$OUT/pip.log"; exit 3; }
  echo "wheel built in $((SECONDS - start)) s: $(cd "$BUILD/dist" && ls hils-*.whl)"
  "$PY" -m pip install --no-deps "$BUILD"/dist/hils-*.whl >>"$OUT/pip.log" 2>&1 \
    || { tail -n 20 "$OUT/pip.log"; exit 3; }
  tail -n 1 "$OUT/pip.log"
  cd "$OUT"  # not the checkout: `import hils` must find the installed package
  # The library the tests will use: the installed package's, or stop here.
  env -u HILS_GPU_LIB "$PY" -c "import hils.gpu, os; lib = hils.gpu.find_library(); print('library:', lib)
assert os.path.dirname(lib) == os.path.dirname(hils.__file__), 'not the installed package copy'" \
    || { echo "the installed package has no libhils_gpu_c.so"; exit 3; }
  # The five pytest processes at once (test_gpu_decode.py, the longest, ~100 s on an H100).
  PYTEST_GROUPS=(test_gpu_kernels test_gpu_forward test_gpu_decode test_gpu_backward "test_gpu_module test_decode_kernel_names")
  pids=()
  for group in "${PYTEST_GROUPS[@]}"; do
    files=()
    for f in $group; do files+=("$ROOT/tests/python/$f.py"); done
    env -u HILS_GPU_LIB OMP_NUM_THREADS=2 "$PY" -m pytest -s -rA -p no:cacheprovider "${files[@]}" \
      >"$OUT/pytest_${group%% *}.log" 2>&1 &
    pids+=($!)
  done
  status=0
  start=$SECONDS
  for i in "${!PYTEST_GROUPS[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "== pytest ${PYTEST_GROUPS[$i]} (HILS_GPU_LIB unset)"
    grep -E "^HEADROOM|PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$OUT/pytest_${PYTEST_GROUPS[$i]%% *}.log" || true
  done
  echo "pytests done in $((SECONDS - start)) s (status $status)"
  exit $status
fi
NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"

# Carried dependencies (see gpu/NOTES.md): Eigen and Catch2 headers with their CMake configs.
DEP_ARGS=()
# Layout: $DEPS/include/{eigen3,catch2}, $DEPS/share/eigen3/cmake, $DEPS/lib/cmake/Catch2
# (copies of /usr's, so the configs' relative prefixes resolve inside $DEPS).
if [ -d "$DEPS/include" ]; then
  DEP_ARGS=(-DCMAKE_PREFIX_PATH="$DEPS" -DEigen3_DIR="$DEPS/share/eigen3/cmake"
            -DCatch2_DIR="$DEPS/lib/cmake/Catch2")
fi
# A build folder configured by the older script (its own small project) cannot be reused.
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT" "$BUILD/CMakeCache.txt"; then
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
fi
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_CUDA_COMPILER="$NVCC" -DHILS_CUDA_ARCHITECTURES="${HILS_CUDA_ARCHITECTURES:-90a}" \
  -DHILS_BUILD_ANALYSIS=OFF -DHILS_BUILD_EXPERIMENTS=OFF -DHILS_BUILD_PYTHON=OFF \
  "${DEP_ARGS[@]}" 2>&1 | tee "$OUT/configure.log" | tail -3
TEST_BIN="$BUILD/tests/gpu/test_gpu_kernels"
ninja -C "$BUILD" ${HILS_NINJA_FLAGS:-} test_gpu_kernels hils_gpu_c 2>&1 | tee "$OUT/build.log" | grep -E "error|warning|FAILED" || true
[ -x "$TEST_BIN" ] || { echo "build failed: see $OUT/build.log"; exit 3; }
[ "$BUILD_ONLY" = 1 ] && { echo "built"; exit 0; }

if [ "$DECODE" = 1 ]; then
  status=0
  echo "== decode tests"
  "$TEST_BIN" "gpu decode*" >"$OUT/decode_tests.log" 2>&1 || status=1
  grep -E "^(decode ties|decode three tiles|decode eleven tiles|All tests|test cases)" "$OUT/decode_tests.log" || true
  grep -cE "^=== decode" "$OUT/decode_tests.log" | sed "s/^/decode reports: /" || true
  grep -E "FAIL" "$OUT/decode_tests.log" | head -20 || true
  echo "== decode dumps for hils verify"
  PYTHONUNBUFFERED=1 python3 "$ROOT/gpu/bench/dump_decode_verify.py" --lib "$BUILD/gpu/libhils_gpu_c.so" \
    --out "$OUT" >"$OUT/decode_dump.log" 2>&1 && tail -n 2 "$OUT/decode_dump.log" \
    || { echo "decode dump failed:"; tail -n 5 "$OUT/decode_dump.log"; status=1; }
  if [ "$BENCH" = 1 ]; then
    echo "== decode benchmark"
    PYTHONUNBUFFERED=1 python3 "$ROOT/gpu/bench/bench_decode.py" --lib "$BUILD/gpu/libhils_gpu_c.so" --profile \
      --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.log" || status=1
  fi
  echo "== compute-sanitizer memcheck (decode tests)"
  compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$TEST_BIN" "gpu decode*" \
    >"$OUT/decode_memcheck.log" 2>&1 && echo "memcheck clean" || { echo "memcheck FAILED"; status=1; }
  grep -E "ERROR SUMMARY|Invalid|LEAK" "$OUT/decode_memcheck.log" | head -5 || true
  exit $status
fi

status=0
echo "== GPU tests"
( cd "$BUILD" && ctest -L gpu --output-on-failure -j1 ) >"$OUT/ctest.log" 2>&1 || status=1
tail -n 25 "$OUT/ctest.log"
if [ "$QUICK" = 0 ]; then
REPORT="$OUT/test_report.log"
if [ "$NO_REPORT" = 0 ]; then
  "$TEST_BIN" >"$REPORT" 2>&1 || status=1
  grep -E "^(===|  |ties|near)" "$REPORT" | grep -c PASS | sed "s/^/tensor reports passing: /" || true
  grep -E "FAIL" "$REPORT" | head -20 || true
fi

echo "== compute-sanitizer memcheck"
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full \
    "$TEST_BIN" >"$OUT/memcheck.log" 2>&1 && echo "memcheck clean" || { echo "memcheck FAILED"; status=1; }
  grep -E "ERROR SUMMARY|Invalid|LEAK" "$OUT/memcheck.log" | head -5 || true
  if [ "$NO_REPORT" = 1 ]; then
    grep -E "^(===|  |ties|near)" "$OUT/memcheck.log" | grep -c PASS | sed "s/^/tensor reports passing (memcheck run): /" || true
    grep -E "FAIL" "$OUT/memcheck.log" | head -20 || true
  fi
else
  echo "compute-sanitizer not found"; status=1
fi
else
  grep -E "FAIL" "$OUT/ctest.log" | head -20 || true
  echo "(--quick: no second test report, no memcheck)"
fi

echo "== dump kernel outputs for hils verify"
if PYTHONUNBUFFERED=1 python3 "$ROOT/gpu/bench/dump_verify.py" --lib "$BUILD/gpu/libhils_gpu_c.so" \
    --out "$OUT" >"$OUT/dump.log" 2>&1; then
  tail -n 3 "$OUT/dump.log"
else
  echo "dump failed:"; tail -n 5 "$OUT/dump.log" || true; status=1
fi

if [ "$BENCH" = 1 ]; then
  echo "== benchmark"
  PYTHONUNBUFFERED=1 python3 "$ROOT/gpu/bench/bench_hils.py" --lib "$BUILD/gpu/libhils_gpu_c.so" \
    --max-T "${HILS_BENCH_MAX_T:-524288}" --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" || status=1
fi
if [ "$PROFILE" = 1 ]; then
  echo "== Nsight Compute (window, select, fuse at T=${HILS_PROFILE_T:-131072})"
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)"
  if [ -n "$NCU" ]; then
    "$NCU" --profile-from-start off --clock-control none \
      -k "regex:window_packed|select_packed_kernel|select_one_pass_kernel|chunk_attention|reduce_kernel" -c 6 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --metrics "smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 "$ROOT/gpu/bench/profile_stages.py" --lib "$BUILD/gpu/libhils_gpu_c.so" \
      --T "${HILS_PROFILE_T:-131072}" >"$OUT/ncu.log" 2>&1 || echo "ncu failed (see ncu.log)"
    grep -E "^  [A-Za-z_].*\(|Duration|smsp__inst_executed.sum|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" "$OUT/ncu.log" | head -60 || true
    # The largest stall reasons (warps per issued instruction) of each profiled kernel.
    python3 - "$OUT/ncu.log" <<'PY' || true
import re, sys
cur, rows = None, {}
for line in open(sys.argv[1]):
    if re.match(r"^  [A-Za-z_].*\(", line):
        cur = line.strip()[:70]
        rows[cur] = []
    elif "issue_stalled" in line and cur:
        parts = line.split()
        try:
            rows[cur].append((float(parts[-1].replace(",", "")), parts[0]))
        except ValueError:
            pass
for name, stalls in rows.items():
    stalls.sort(reverse=True)
    print(name)
    for value, metric in stalls[:6]:
        short = metric.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")
        print(f"    stall {short:24s} {value:.2f}")
PY
  else
    echo "ncu not found"
  fi
fi
# At most 8 files come back from the device machine: logs go into one archive.
tar -C "$OUT" -czf "$OUT/logs.tar.gz" --remove-files \
  $(cd "$OUT" && ls configure.log build.log ctest.log test_report.log memcheck.log dump.log bench.log ncu.log 2>/dev/null)
exit $status
