#!/bin/sh
# verify_cli_test.sh HILS MAKER CASE BREAK EXPECTED_EXIT REGEX [PRESET] [PRECISION] [FLAG]:
# writes a verify file with MAKER, runs `HILS verify [FLAG]` on it, and checks the exit code and
# that the output matches REGEX (grep -E).
set -u
hils=$1 maker=$2 case_name=$3 kind=$4 expected=$5 regex=$6
preset=${7:-hils} precision=${8:-fp32} flag=${9:-}
dir=$(mktemp -d) || exit 3
trap 'rm -rf "$dir"' EXIT
"$maker" "$dir/dump.h5" "$case_name" "$kind" "$preset" "$precision" || exit 3
"$hils" verify $flag "$dir/dump.h5" > "$dir/out.txt" 2>&1
status=$?
cat "$dir/out.txt"
if [ "$status" -ne "$expected" ]; then
  echo "verify_cli_test: expected exit $expected, got $status"
  exit 1
fi
if ! grep -Eq -- "$regex" "$dir/out.txt"; then
  echo "verify_cli_test: output does not match: $regex"
  exit 1
fi
echo "verify_cli_test: ok (exit $status, matched: $regex)"
