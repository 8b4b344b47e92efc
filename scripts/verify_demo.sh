#!/usr/bin/env bash
# Shows `hils verify` on a good kernel dump and on deliberately broken ones (data/verify_format.md).
# Usage (repository root): scripts/verify_demo.sh [BUILD_DIR] [OUT_DIR] [DUMP_DIR]
#   BUILD_DIR holds bin/hils and tests/oracle/oracle_make_verify_file (default build-oracle;
#   if missing, configured (when it has no CMakeCache.txt: Ninja, without the GPU and Python
#   parts, which the demo does not use) and built with
#   `cmake --build BUILD_DIR --target hils oracle_make_verify_file`).
#   OUT_DIR receives the .h5 files and one .txt report per file (default out/verify_demo).
#   DUMP_DIR (optional): a folder of real kernel dumps (e.g. from gpu/bench/dump_verify.py);
#   `hils verify` runs on each of its .h5 files too and its verdict is printed (not judged).
# The "kernel" is the reference's float run on a case of the shared table; each broken file
# must exit 1 with a message naming the fault, the good ones exit 0.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build-oracle}"
OUT="${2:-$ROOT/out/verify_demo}"
DUMPS="${3:-}"
HILS="$BUILD/bin/hils"
MAKER="$BUILD/tests/oracle/oracle_make_verify_file"
if [ ! -x "$HILS" ] || [ ! -x "$MAKER" ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DHILS_BUILD_GPU=OFF -DHILS_BUILD_PYTHON=OFF >/dev/null ||
      { echo "configure failed" >&2; exit 3; }
  fi
  cmake --build "$BUILD" --target hils oracle_make_verify_file >/dev/null || { echo "build failed" >&2; exit 3; }
fi
mkdir -p "$OUT"
status=0
# file | case | break | preset | precision | expected exit
while IFS='|' read -r name case_name kind preset precision expected; do
  "$MAKER" "$OUT/$name.h5" "$case_name" "$kind" "$preset" "$precision" 2>/dev/null || { echo "$name: maker failed"; status=3; continue; }
  "$HILS" verify "$OUT/$name.h5" >"$OUT/$name.txt" 2>&1
  got=$?
  verdict=$([ "$got" = "$expected" ] && echo "as expected" || { status=1; echo "UNEXPECTED (wanted $expected)"; })
  echo "== $name: exit $got ($verdict)"
  grep -E "FAIL:|diagnosis:|bad input" "$OUT/$name.txt" | head -n 3
done <<'CASES'
good_hils_fp32|longer_blocks|none|hils|fp32|0
good_hils_bf16|peaked_attention|none|hils|bf16|0
good_nsa_fp32|ragged_tail_no_landmarks|none|nsa|fp32|0
wrong_chunk|longer_blocks|wrong_chunk|hils|fp32|1
shifted_window|gqa_group4|shifted_window|hils|fp32|1
missing_softmax1|peaked_attention|missing_softmax1|hils|fp32|1
nan|gqa_group4|nan|hils|fp32|1
all_zero|gqa_group4|all_zero|hils|fp32|1
bad_spec|gqa_group4|bad_spec|hils|fp32|2
CASES
if [ -n "$DUMPS" ]; then
  for dump in "$DUMPS"/*.h5; do
    [ -e "$dump" ] || continue
    report="$OUT/dump_$(basename "$dump" .h5).txt"
    "$HILS" verify "$dump" >"$report" 2>&1
    got=$?
    echo "== dump $(basename "$dump"): exit $got"
    grep -E "FAIL:|diagnosis:|bad input" "$report" | head -n 3
  done
fi
exit $status
