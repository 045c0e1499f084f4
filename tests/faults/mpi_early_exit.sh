#!/bin/sh
# A rank that exits early must end a 4-rank MPI job with a non-zero status within a bound (no hang).
# `die` (process gone): mpirun names the rank that exited. `return` (clean early exit): the waiting ranks
# give up after the communicator timeout (5 s) with CommError. Exit 77 (skip) without mpirun.
exe="$1"
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipping"; exit 77; }
# Under AddressSanitizer, Open MPI's dlopen'ed plugins leak allocations LeakSanitizer cannot attribute (their
# modules are unloaded at exit, so tools/lsan.supp cannot name them): no leak checking in mpirun jobs.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpi="mpirun --allow-run-as-root --oversubscribe -np 4"
for mode in die return; do
  start=$(date +%s)
  out=$(timeout 90 $mpi "$exe" --mode $mode 2>&1)
  rc=$?
  took=$(( $(date +%s) - start ))
  echo "--- mode $mode: exit $rc after ${took}s"
  echo "$out" | tail -12
  [ $rc -ne 0 ] || { echo "FAIL ($mode): job with an early-exiting rank exited 0"; exit 1; }
  [ $rc -ne 124 ] || { echo "FAIL ($mode): job hung (timeout 90 s)"; exit 1; }
  case $mode in
    # Open MPI: "Process name: [[jobid,1],1]" / "rank 1 ... exited" in its termination notice.
    die) echo "$out" | grep -Eq '\[\[[0-9]+,[0-9]+\],1\]|rank 1' || { echo "FAIL (die): no message naming rank 1"; exit 1; } ;;
    return) echo "$out" | grep -q "waited 5000 ms for its peers; rank(s) 1 had already finished" || { echo "FAIL (return): no CommError naming rank 1 after the timeout"; exit 1; } ;;
  esac
done
echo "PASS"
