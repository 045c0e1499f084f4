#!/bin/sh
# `tessel run` under mpirun (exit 77 = skip without mpirun):
#  1. --trace writes ONE trace holding every rank (gathered to rank 0), not PATH.rank<R> per process, on
#     one time origin;
#  2. a world size that differs from the layout exits 2 on every rank with the rule, before training
#     (no step line printed) and without MPI_Abort;
#  3. --json: stdout holds one JSON document (rank 0's), with every rank's memory gathered over MPI;
#  4. a mixture of experts with ep over processes trains as on one rank.
exe="$1"
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipping"; exit 77; }
# Under AddressSanitizer, Open MPI's dlopen'ed plugins leak allocations LeakSanitizer cannot attribute (their
# modules are unloaded at exit, so tools/lsan.supp cannot name them): no leak checking in mpirun jobs.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
mpi="mpirun --allow-run-as-root --oversubscribe"

# 1. pp 2 x tp 2 = 4 processes; expected: trace.json exists, no trace.json.rank*, pids 0..3 named.
timeout 300 $mpi -np 4 "$exe" run --tp 2 --pp 2 --steps 1 --trace "$dir/trace.json" >"$dir/out1.txt" 2>&1
rc=$?
tail -3 "$dir/out1.txt"
[ $rc -eq 0 ] || { echo "FAIL: mpirun tessel run --trace exited $rc"; cat "$dir/out1.txt"; exit 1; }
[ -f "$dir/trace.json" ] || { echo "FAIL: no $dir/trace.json"; exit 1; }
ls "$dir" | grep -q 'trace.json.rank' && { echo "FAIL: per-rank trace files written"; exit 1; }
for r in 0 1 2 3; do
  grep -q "\"rank $r (stage" "$dir/trace.json" || { echo "FAIL: rank $r missing from the gathered trace"; exit 1; }
done
grep -q "4 ranks)" "$dir/out1.txt" || { echo "FAIL: rank 0 did not report 4 ranks in the trace"; exit 1; }
# One time origin for all processes: no recv ends more than 1 ms before its send starts (each process's own
# start as origin put them tens of ms apart), and tessel reads its own trace back.
"$exe" compare "$dir/trace.json" "$dir/trace.json" >"$dir/cmp.txt" 2>&1 ||
  { echo "FAIL: tessel compare cannot read the gathered trace"; cat "$dir/cmp.txt"; exit 1; }
if command -v python3 >/dev/null 2>&1; then
  python3 - "$dir/trace.json" <<'PY' || exit 1
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
s = {e["id"]: e["ts"] for e in ev if e["ph"] == "s"}
f = {e["id"]: e["ts"] for e in ev if e["ph"] == "f"}
late = [(i, s[i] - t) for i, t in f.items() if t < s[i] - 1000.0]
print(f"{len(f)} flows, {len(late)} ending more than 1 ms before they start")
sys.exit(1 if late or not f else 0)
PY
fi

# 2. 3 processes for a 4-GPU layout.
timeout 120 $mpi -np 3 "$exe" run --tp 2 --pp 2 --steps 1 >"$dir/out2.txt" 2>&1
rc=$?
cat "$dir/out2.txt" | head -20
[ $rc -eq 2 ] || { echo "FAIL: world-size mismatch exited $rc, expected 2"; exit 1; }
for r in 0 1 2; do
  grep -q "mpirun started 3 processes (this is rank $r), but the layout .* needs tp\*pp\*dp = 4" "$dir/out2.txt" ||
    { echo "FAIL: no message from rank $r"; exit 1; }
done
grep -q "^step " "$dir/out2.txt" && { echo "FAIL: training started despite the mismatch"; exit 1; }
grep -qi "MPI_ABORT" "$dir/out2.txt" && { echo "FAIL: the mismatch went through MPI_Abort"; exit 1; }
# 3. pp 2 x dp 2 = 4 processes with --json; expected: stdout parses as one document (the other ranks print
#    nothing there), comm "mpi", one step, memory of ranks 0..3 each with its activation peak; the human
#    lines on stderr.
timeout 300 $mpi -np 4 "$exe" run --pp 2 --dp 2 --steps 1 --json >"$dir/out3.json" 2>"$dir/err3.txt"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: mpirun tessel run --json exited $rc"; cat "$dir/err3.txt"; exit 1; }
grep -q "^step    1 " "$dir/err3.txt" || { echo "FAIL: no step line on stderr"; cat "$dir/err3.txt"; exit 1; }
if command -v python3 >/dev/null 2>&1; then
  python3 - "$dir/out3.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))  # fails on anything but one document
c = d["config"]
ok = (c["comm"] == "mpi" and c["ranks"] == 4 and len(d["steps"]) == 1 and
      [m["rank"] for m in d["memory"]] == [0, 1, 2, 3] and all(m["peak_activation_bytes"] > 0 for m in d["memory"]))
print("json:", c["comm"], len(d["memory"]), "ranks")
sys.exit(0 if ok else 1)
PY
fi
# 4. Expert parallelism over MPI processes: tiny-moe on tp 2 (sp, etp 1) x dp 2 with ep 4 (tokens exchanged
#    between processes by all-to-all) gives the losses and load-balancing losses of the one-rank run.
timeout 300 $mpi -np 4 "$exe" run --model tiny-moe --tp 2 --sp --etp 1 --dp 2 --ep 4 --gbs 8 --steps 2 --json \
  >"$dir/moe4.json" 2>"$dir/moe4.txt" || { echo "FAIL: mpirun tiny-moe ep 4"; cat "$dir/moe4.txt"; exit 1; }
#    And with each expert split over etp 2 (--etp left at tp 2, Megatron-Core's default) on ep 2: the etp
#    ranks' gathers and reduce-scatters between processes.
timeout 300 $mpi -np 4 "$exe" run --model tiny-moe --tp 2 --sp --dp 2 --ep 2 --gbs 8 --steps 2 --json \
  >"$dir/moe_etp.json" 2>"$dir/moe_etp.txt" || { echo "FAIL: mpirun tiny-moe ep 2 etp 2"; cat "$dir/moe_etp.txt"; exit 1; }
timeout 300 "$exe" run --model tiny-moe --gbs 8 --steps 2 --json >"$dir/moe1.json" 2>"$dir/moe1.txt" ||
  { echo "FAIL: tiny-moe on one rank"; cat "$dir/moe1.txt"; exit 1; }
if command -v python3 >/dev/null 2>&1; then
  python3 - "$dir/moe1.json" "$dir/moe4.json" "$dir/moe_etp.json" <<'PY' || exit 1
import json, sys
a = json.load(open(sys.argv[1]))["steps"]
ok = True
for path in sys.argv[2:4]:
    b = json.load(open(path))["steps"]
    for x, y in zip(a, b):
        print(f"{path.rsplit('/', 1)[-1]} step {x['step']}: loss {x['loss']:.6f} / {y['loss']:.6f}, aux {x['aux_loss']:.6f} / {y['aux_loss']:.6f}")
    ok = ok and len(a) == len(b) == 2 and all(abs(x["loss"] - y["loss"]) <= 1e-5 * x["loss"] and
                                              abs(x["aux_loss"] - y["aux_loss"]) <= 1e-4 * x["aux_loss"] for x, y in zip(a, b))
sys.exit(0 if ok else 1)
PY
fi
echo "PASS"
