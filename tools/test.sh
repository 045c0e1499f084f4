#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: the README's second command, and what CI runs.
#   1. tools/setup.sh build       installs what is missing, configures and builds (CUDA when found)
#   2. meson test -C build        every suite; GPU tests skip (77) without a device
#   3. a short fuzz run           every parser's libFuzzer target on the committed corpus (clang, ASan+UBSan),
#                                 FUZZ_RUNS inputs per target from a fixed seed (default 3000: the same
#                                 inputs on every machine, so CI cannot flake); TESSEL_SKIP_FUZZ=1 leaves it out
#   4. the suite under ASan+UBSan tools/sanitize.sh asan (clang, build-asan); TESSEL_SKIP_ASAN=1 leaves it out.
#                                 Measured here: ~21 min build + ~20 min tests (docs/reliability.md)
# Ends with one line "tests: N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build || exit 1
meson test -C build --print-errorlogs
rc=$?
fuzz_rc=0
fuzz=skipped
if [ "${TESSEL_SKIP_FUZZ:-0}" != 1 ]; then
  fuzz_log="$(mktemp "${TMPDIR:-/tmp}/tessel-fuzz.XXXXXX")"
  FUZZ_RUNS="${FUZZ_RUNS:-3000}" tools/sanitize.sh fuzz 2>&1 | tee "$fuzz_log"
  fuzz_rc=$?
  fuzz=$([ $fuzz_rc -eq 0 ] && echo ok || echo failed)
fi
asan_rc=0
asan=skipped
if [ "${TESSEL_SKIP_ASAN:-0}" != 1 ]; then
  tools/sanitize.sh asan
  asan_rc=$?
  asan=$([ $asan_rc -eq 0 ] && echo ok || echo failed)
fi
python3 - "$fuzz" "$asan" <<'PY'
import json, sys
passed = failed = skipped = 0
for line in open("build/meson-logs/testlog.json"):
    r = json.loads(line).get("result")
    if r in ("OK", "EXPECTEDFAIL"): passed += 1
    elif r == "SKIP": skipped += 1
    else: failed += 1
for name, state in (("fuzz smoke (fixed seed)", sys.argv[1]), ("ASan+UBSan suite", sys.argv[2])):
    print(f"{name}: {state}")
    passed += state == "ok"
    failed += state == "failed"
    skipped += state == "skipped"
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
PY
# A failed fuzz target's lines again at the very end, where a truncated CI log still shows them.
[ $fuzz_rc -eq 0 ] || grep -A4 ' FAIL$\|^no fuzz executable' "${fuzz_log:-/dev/null}" | head -40
[ $rc -eq 0 ] && [ $fuzz_rc -eq 0 ] && [ $asan_rc -eq 0 ]
