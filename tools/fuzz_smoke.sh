#!/usr/bin/env bash
# Short fuzz run of every libFuzzer target on the committed corpus (tests/fuzz/corpus/<target>), for CI:
# a few seconds each, new inputs go to a scratch folder (the committed corpus is never modified). A crash,
# leak, timeout or out-of-memory fails the run and leaves the input under $FUZZ_ARTIFACTS.
#
#   tools/fuzz_smoke.sh <build-fuzz/tests/fuzz> [seconds per target, default 5]
# Longer runs (docs/reliability.md): FUZZ_SECONDS=600 tools/fuzz_smoke.sh build-fuzz/tests/fuzz
# FUZZ_RUNS=N: N inputs per target from a fixed seed (FUZZ_SEED, default 1) instead of a time budget, so
# every machine tries the same inputs: CI uses this (tools/test.sh); an exploratory run finds new crashes,
# which are fixed and committed under tests/fuzz/regressions/ before CI ever meets them.
set -u
dir="${1:?usage: fuzz_smoke.sh <folder with fuzz_* executables> [seconds]}"
secs="${2:-${FUZZ_SECONDS:-5}}"
root="$(cd "$(dirname "$0")/.." && pwd)"
corpus="$root/tests/fuzz/corpus"
work="$(mktemp -d "${TMPDIR:-/tmp}/tessel-fuzz-smoke.XXXXXX")"
artifacts="${FUZZ_ARTIFACTS:-$work/artifacts}"
mkdir -p "$artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
failed=0
printf '%-22s %10s %8s %6s\n' target execs budget result
# One target per corpus folder: a format without its fuzz executable fails the run.
for seeds in "$corpus"/*/; do
  name="$(basename "$seeds")"
  exe="$dir/fuzz_$name"
  [ -f "$exe" ] && [ -x "$exe" ] || { echo "no fuzz executable for $name ($exe)"; failed=1; continue; }
  scratch="$work/$name"
  mkdir -p "$scratch"
  log="$work/$name.log"
  # -rss_limit_mb: an input that makes a parser allocate what it claims fails here (OOM), -timeout: a hang.
  if [ -n "${FUZZ_RUNS:-}" ]; then budget=(-runs="$FUZZ_RUNS" -seed="${FUZZ_SEED:-1}"); else budget=(-max_total_time="$secs"); fi
  "$exe" "$scratch" "$corpus/$name" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/$name-" >"$log" 2>&1
  rc=$?
  execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  time=$(grep -m1 'stat::' "$log" >/dev/null && echo "${FUZZ_RUNS:-${secs}s}" || echo "?")
  if [ $rc -eq 0 ]; then
    printf '%-22s %10s %8s %6s\n' "$name" "${execs:-?}" "$time" ok
  else
    printf '%-22s %10s %8s %6s\n' "$name" "${execs:-?}" "$time" FAIL
    grep -E 'ERROR|SUMMARY|runtime error|invariant|uncaught|what\(\)' "$log" | head -8
    failed=1
  fi
done
[ $failed -eq 0 ] && rm -rf "$work" || echo "logs and crashing inputs: $work (artifacts: $artifacts)"
exit $failed
