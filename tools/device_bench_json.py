#!/usr/bin/env python3
"""Turns the device check's sweep (bench.csv from tests/cuda/bench_cuda.cpp: kind,name,shape,ms,value,unit)
into the `tessel-bench` document `tessel calibrate --bench` reads (sim/calibrate/bench_data.hpp), for one
GEMM precision: the GEMM rows of that precision and the device-to-device copy as the memory row.

    tools/device_bench_json.py bench/h200/bench.csv --precision bf16 -o bench/h200/bench-bf16.json
    build/tools/tessel calibrate --bench bench/h200/bench-bf16.json --base-system h200 -o bench/h200/h200-fitted.json
"""
import argparse
import csv
import json
import sys

NAMES = {"bf16": "bf16", "fp32": "tf32"}  # the sweep's GEMM type for each calibrate precision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--precision", choices=sorted(NAMES), default="bf16")
    ap.add_argument("-o", required=True)
    a = ap.parse_args()
    gemm, membw = [], []
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            ms = float(r["ms"])
            if r["kind"] == "gemm" and r["name"] == NAMES[a.precision]:
                m, n, k = (int(x) for x in r["shape"].split("x"))
                gemm.append({"m": m, "n": n, "k": k, "batch": 1, "time_us": ms * 1e3})
            elif r["kind"] == "bandwidth" and r["name"] == "copy":
                # value GB/s counts bytes read + written over the time
                membw.append({"kernel": "copy", "bytes": float(r["value"]) * 1e9 * ms * 1e-3, "time_us": ms * 1e3})
    if not gemm:
        sys.exit(f"{a.csv}: no {NAMES[a.precision]} GEMM rows")
    doc = {"format": "tessel-bench", "version": 1, "backend": "cuda", "gemm_backend": "cublaslt",
           "precision": a.precision, "concurrent": 1, "gemm": gemm, "membw": membw, "collectives": [],
           "notes": "converted from the device check's bench.csv by tools/device_bench_json.py"}
    with open(a.o, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
