#!/usr/bin/env bash
# Times `hils verify` at a kernel author's sizes (README "The oracle's speed"): for each row of
# the grid below a verify file is written by the tests' maker (tests/oracle/make_verify_file.cpp:
# the reference's float run on bf16 inputs as the kernel, o stored in bf16; with gradients its
# float backward), then `hils verify` runs under /usr/bin/time -v, REPEAT times. One line per
# run: T, geometry, preset, gradients, wall seconds, user+sys CPU seconds, peak RSS, exit status.
# Usage (repository root): scripts/bench_verify.sh BUILD_DIR OUT_DIR [GRID_FILE] [REPEAT]
#   BUILD_DIR holds bin/hils and tests/oracle/oracle_make_verify_file (built).
#   GRID_FILE: lines "T Hq Hkv d preset K grads(0|1)" (default: the grid below).
#   Files are kept in OUT_DIR (a T = 131072 file of Hq = 16, d = 64 is ~1.2 GB) and reused
#   when present; the results go to OUT_DIR/timings.txt as well as stdout.
set -uo pipefail
BUILD="${1:?usage: scripts/bench_verify.sh BUILD_DIR OUT_DIR [GRID_FILE] [REPEAT]}"
OUT="${2:?usage: scripts/bench_verify.sh BUILD_DIR OUT_DIR [GRID_FILE] [REPEAT]}"
GRID="${3:-}"
REPEAT="${4:-1}"
HILS="$BUILD/bin/hils"
MAKER="$BUILD/tests/oracle/oracle_make_verify_file"
[ -x "$HILS" ] && [ -x "$MAKER" ] || { echo "no $HILS or $MAKER: build them first" >&2; exit 3; }
mkdir -p "$OUT"
default_grid() {
  cat <<'ROWS'
8192 16 2 64 full 0 0
8192 16 2 64 swa 0 0
8192 16 2 64 nsa 16 0
8192 16 2 64 hils 32 0
8192 16 2 64 hils 32 1
ROWS
}
grid() { if [ -n "$GRID" ]; then cat "$GRID"; else default_grid; fi; }
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $("$HILS" --version)" |
  tee -a "$OUT/timings.txt"
echo "# T Hq Hkv d preset K grads | wall_s cpu_s peak_rss_MiB exit" | tee -a "$OUT/timings.txt"
grid | while read -r T Hq Hkv d preset K grads; do
  [ -z "$T" ] || [ "${T#\#}" != "$T" ] && continue
  landmarks=0
  [ "$preset" = hils ] && landmarks=1
  case_text="longer_blocks:T=$T,S=64,W=512,K=$K,Hq=$Hq,Hkv=$Hkv,d=$d,dv=$d,landmarks=$landmarks"
  kind=none
  [ "$grads" = 1 ] && kind=grads
  file="$OUT/verify_T${T}_Hq${Hq}_Hkv${Hkv}_d${d}_${preset}_${kind}.h5"
  if [ ! -f "$file" ]; then
    "$MAKER" "$file" "$case_text" "$kind" "$preset" bf16 >/dev/null 2>"$OUT/maker.err" ||
      { echo "$T $Hq $Hkv $d $preset $K $grads | maker failed: $(tail -1 "$OUT/maker.err")"; continue; }
  fi
  for _ in $(seq "$REPEAT"); do
    /usr/bin/time -v -o "$OUT/time.txt" "$HILS" verify "$file" >"$OUT/report.txt" 2>&1
    status=$?
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s}' "$OUT/time.txt")
    cpu=$(awk -F': ' '/User time|System time/ {s += $2} END {printf "%.1f", s}' "$OUT/time.txt")
    rss=$(awk -F': ' '/Maximum resident/ {printf "%.0f", $2 / 1024}' "$OUT/time.txt")
    echo "$T $Hq $Hkv $d $preset $K $grads | $wall $cpu $rss $status" | tee -a "$OUT/timings.txt"
  done
done
