#!/bin/sh
# The install recipe of docs/schedules.md ("In another project's CI"): `meson install` puts one
# self-contained `tessel` under the prefix (presets are compiled in), which then checks a schedule with no
# source tree beside it. Installed into a temporary DESTDIR, run from a directory outside the checkout.
set -eu
build=$1
golden=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"; echo "FAIL: meson install"; exit 1; }
exe=$(find "$tmp/root" -type f -name tessel -perm -u+x | head -n 1)
[ -n "$exe" ] || { echo "FAIL: no tessel under $tmp/root"; exit 1; }
[ -x "$(dirname "$exe")/tessel-run" ] || { echo "FAIL: no tessel-run beside $exe"; exit 1; }
# The planning binary loads no GPU, MPI or BLAS library (issue: `tessel --help` used 225 MB for them).
if command -v ldd >/dev/null 2>&1 && ldd "$exe" | grep -Eq 'libcuda|libcudart|libcublas|libnccl|libmpi|libopenblas'; then
  ldd "$exe"; echo "FAIL: the planning binary links a runtime library"; exit 1
fi
cp "$golden" "$tmp/sched.csv"
cd "$tmp"
"$exe" --version | grep -q '^tessel ' || { echo "FAIL: --version"; exit 1; }
"$exe" schedule validate sched.csv >out.txt || { cat out.txt; echo "FAIL: validate of a valid schedule"; exit 1; }
grep -q 'valid under eager comms' out.txt || { cat out.txt; echo "FAIL: validate's verdict"; exit 1; }
# A broken copy fails the check with exit 1 (a verdict), not 2 (bad input) or 3 (a crash).
sed '1s/0F0,//' sched.csv >broken.csv
set +e
"$exe" schedule validate broken.csv >out.txt
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat out.txt; echo "FAIL: exit $rc for an invalid schedule, expected 1"; exit 1; }
# `tessel run` hands over to the installed tessel-run, arguments and exit code unchanged.
"$exe" run --model tiny --steps 1 --json >run.json 2>run.err || { cat run.err; echo "FAIL: installed tessel run"; exit 1; }
grep -q '"loss"' run.json || { cat run.json; echo "FAIL: tessel run --json through the hand-over"; exit 1; }
set +e
"$exe" run --model tiny --steps 0 >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "FAIL: tessel run --steps 0 exited $rc through the hand-over, expected 2"; exit 1; }
echo "installed $exe and tessel-run: validates, fails an invalid schedule with exit 1, runs through the hand-over"
