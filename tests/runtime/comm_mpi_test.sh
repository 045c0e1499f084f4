#!/bin/sh
# Runs comm_mpi_test under mpirun: 4 ranks pass the collective checks; with rank 1 throwing, the job must
# end (not hang) with a non-zero status and a message naming rank 1. Exit 77 (skip) without mpirun.
exe="$1"
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipping"; exit 77; }
# Under AddressSanitizer, Open MPI's dlopen'ed plugins leak allocations LeakSanitizer cannot attribute (their
# modules are unloaded at exit, so tools/lsan.supp cannot name them): no leak checking in mpirun jobs.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpi="mpirun --allow-run-as-root --oversubscribe -np 4"
timeout 120 $mpi "$exe" || { echo "FAIL: collective checks under mpirun"; exit 1; }
out=$(timeout 60 $mpi "$exe" --fail-rank 1 2>&1)
rc=$?
echo "$out" | tail -5
[ $rc -ne 0 ] || { echo "FAIL: job with a failing rank exited 0"; exit 1; }
[ $rc -ne 124 ] || { echo "FAIL: job with a failing rank hung (timeout)"; exit 1; }
echo "$out" | grep -q "rank 1 of 4 failed: injected failure" || { echo "FAIL: no message naming rank 1"; exit 1; }
echo "PASS"
