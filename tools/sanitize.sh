#!/usr/bin/env bash
# Sanitizer runs (docs/reliability.md has the figures):
#
#   tools/sanitize.sh asan   ASan + UBSan build (clang, -O1) of everything, then the whole test suite.
#                            UBSan is made fatal (halt_on_error) so undefined behaviour fails a test.
#   tools/sanitize.sh tsan   TSan build of the in-process (thread) communicator and the event engine, and
#                            their tests: data races between rank threads or in the engine fail the run.
#   tools/sanitize.sh fuzz   The fuzz build (ASan + UBSan + libFuzzer, tests/fuzz) and a short run of every
#                            target on the committed corpus (tools/fuzz_smoke.sh; FUZZ_SECONDS per target).
#
# Build folders: build-asan, build-tsan, build-fuzz (override with BUILD=...). Needs clang and
# libclang-rt-14-dev (Debian) for the sanitizer and libFuzzer runtimes. JOBS sets ninja's parallelism.
set -euo pipefail
mode="${1:?usage: tools/sanitize.sh asan|tsan|fuzz}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
jobs="${JOBS:-2}"
export CXX="${CXX:-clang++}"
# Leaks are reported (LeakSanitizer) except from Open MPI's own allocations, which it never frees.
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/tools/lsan.supp:print_suppressions=0}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
common=(-Dcuda=disabled -Dbenchmarks=disabled -Doptimization=1 -Db_lundef=false)

setup() {  # setup <folder> <meson options...>
  local dir="$1"
  shift
  if [ -d "$dir/meson-private" ]; then meson configure "$dir" "$@" >/dev/null; else meson setup "$dir" "$@"; fi
}

case "$mode" in
  asan)
    dir="${BUILD:-build-asan}"
    setup "$dir" "${common[@]}" -Db_sanitize=address,undefined
    time ninja -C "$dir" -j"$jobs"
    # Timeouts x3: sanitized code runs 2-3x slower than the release build the timeouts were set for.
    time meson test -C "$dir" --num-processes "$jobs" --timeout-multiplier 3 --print-errorlogs
    ;;
  tsan)
    dir="${BUILD:-build-tsan}"
    # MPI is off: Open MPI's progress threads are not TSan-instrumented and report false races.
    setup "$dir" "${common[@]}" -Db_sanitize=thread -Dmpi=disabled
    time ninja -C "$dir" -j"$jobs" tests/runtime/comm_thread_test tests/sim/sim_engine_test tools/tessel
    time meson test -C "$dir" --num-processes 1 --timeout-multiplier 5 --print-errorlogs comm_thread sim_engine
    ;;
  fuzz)
    dir="${BUILD:-build-fuzz}"
    setup "$dir" "${common[@]}" -Db_sanitize=address,undefined -Dfuzz=enabled -Dcpp_args=-fsanitize=fuzzer-no-link
    time ninja -C "$dir" -j"$jobs" $(cd "$dir" && ninja -t targets all | grep -o '^tests/fuzz/fuzz_[a-z_]*' | sort -u)
    time "$root/tools/fuzz_smoke.sh" "$dir/tests/fuzz" "${FUZZ_SECONDS:-5}"
    ;;
  *)
    echo "unknown mode $mode (asan, tsan or fuzz)" >&2
    exit 2
    ;;
esac
