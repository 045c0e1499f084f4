#!/usr/bin/env python3
"""The closed loop on the CPU backend (issue 8; docs/calibration.md).

One repeat: `tessel bench --backend cpu` -> `tessel calibrate` (bench only, and bench + the trace of one
calibration layout that is not among the held-out ones) -> predict every held-out layout of a small GPT with
the simulator (`tessel simulate`, or `tessel estimate` while simulate is not built) -> run each with
`tessel run --backend cpu` -> per layout the step-time error, and per profile the median |error| and the
Kendall tau between predicted and measured order. Repeats show the spread (the machines are noisy).

Every layout runs exactly 2 ranks (tp*dp*pp = 2), the calibration run too, so on a 2-core machine the
per-rank rates the profile learns are the ones the held-out runs see; see docs/calibration.md for why.

Exit status: 0 when every step produced numbers (the targets are reported, not enforced: timing is noisy),
1 when a tessel command failed. Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

# A GPT large enough that GEMMs, not per-op overheads, dominate a step, small enough for 2 cores.
MODEL = {
    "name": "small-cpu",
    "source": "closed-loop model of tools/closed_loop.py: 4 layers, hidden 256, seq 128",
    "params_b": 0.0033, "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 8, "ffn": 1024, "vocab": 512,
    "seq_len": 128, "activation": "gelu", "norm": "layernorm", "position": "learned", "tied_embeddings": True,
    "bias": True, "dropout": True,
}
QUICK_MODEL = dict(MODEL, name="quick-cpu", layers=2, hidden=64, heads=4, kv_heads=4, ffn=256, vocab=256, seq_len=32,
                   params_b=0.0001)

# Every layout keeps exactly 2 ranks (tp*pp*dp = 2) so both cores are busy as in the calibration run; a
# 1-rank layout runs at another per-rank rate (one core idle, less memory contention) that a single profile
# cannot also describe (docs/calibration.md, "Oversubscription").
# The calibration layout (its trace refines the profile); never among the held-out layouts.
CALIB = dict(name="calib dp2 mbs1", tp=1, pp=1, dp=2, mbs=1, gbs=4, schedule="1f1b", recompute="none")
# Held-out layouts: different tp/pp/dp, schedules, micro-batch sizes and counts, recompute, SP, ZeRO.
HELD_OUT = [
    dict(name="tp2", tp=2, pp=1, dp=1, mbs=1, gbs=4, schedule="1f1b", recompute="none"),
    dict(name="tp2 sp selective mbs2", tp=2, pp=1, dp=1, mbs=2, gbs=8, schedule="1f1b", recompute="selective", sp=True),
    dict(name="tp2 full-recompute gbs8", tp=2, pp=1, dp=1, mbs=1, gbs=8, schedule="1f1b", recompute="full"),
    dict(name="dp2 zero1 mbs2 gbs8", tp=1, pp=1, dp=2, mbs=2, gbs=8, schedule="1f1b", recompute="none", zero=1),
    dict(name="dp2 full-recompute gbs8", tp=1, pp=1, dp=2, mbs=1, gbs=8, schedule="1f1b", recompute="full"),
    dict(name="pp2 1f1b gbs8", tp=1, pp=2, dp=1, mbs=1, gbs=8, schedule="1f1b", recompute="none"),
    dict(name="pp2 gpipe mbs2 gbs8", tp=1, pp=2, dp=1, mbs=2, gbs=8, schedule="gpipe", recompute="none"),
    dict(name="pp2 interleaved gbs8", tp=1, pp=2, dp=1, mbs=1, gbs=8, schedule="interleaved", vpp=2, recompute="none"),
    dict(name="pp2 1f1b full gbs16", tp=1, pp=2, dp=1, mbs=1, gbs=16, schedule="1f1b", recompute="full"),
    dict(name="pp2 1f1b gbs4", tp=1, pp=2, dp=1, mbs=1, gbs=4, schedule="1f1b", recompute="none"),
]
QUICK_HELD_OUT = [HELD_OUT[0], HELD_OUT[3], HELD_OUT[5]]


def sh(cmd, out_path=None):
    """Runs a tessel command; its stdout (to a file when out_path) is returned. Failure ends the loop."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write("closed_loop: failed (exit %d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr))
        sys.exit(1)
    if out_path:
        with open(out_path, "w") as f:
            f.write(r.stdout)
    return r.stdout


def layout_flags(l):
    f = ["--tp", str(l["tp"]), "--pp", str(l["pp"]), "--dp", str(l["dp"]), "--mbs", str(l["mbs"]), "--gbs", str(l["gbs"]),
         "--schedule", l["schedule"], "--recompute", l["recompute"], "--zero", str(l.get("zero", 0))]
    f += ["--vpp", str(l.get("vpp", 1))]
    if l.get("sp"):
        f.append("--sp")
    return f


def predict_cmd(tessel, engine, model, profile, l):
    # The runtime computes in fp32 and reduces gradients after the backward (no overlap): the prediction
    # describes that same execution. Its attention core is one fused scalar loop (kernels/cpu/attention.cpp,
    # QK^T, softmax and PV per row), which the cost model's unfused path would charge as two batched GEMMs
    # at the BLAS rate plus a softmax at the memory rate; the flash path charges it at attention_efficiency,
    # the rate `tessel bench` measures for that kernel (docs/calibration.md). So predictions use "flash".
    extra = ["--cp", "1", "--precision", "fp32", "--attention", "flash", "--no-overlap"]
    if not l.get("sp"):
        extra.append("--no-sp")
    return [tessel, engine, "--model", model, "--system", profile, "--json"] + layout_flags(l) + extra


def predict(tessel, engine, model, profile, l):
    j = json.loads(sh(predict_cmd(tessel, engine, model, profile, l)))
    return float(j["step_s"])


def measure(tessel, model, l, steps, trace=None):
    """Fastest step time of `tessel run` after the first two (warm-up) steps.

    The minimum, not the median: other work on the machine (compiles of other engineers on 2 cores) only
    ever adds time to a step, and the same layout measured 1.0x-2.2x apart depending on it; the fastest step
    is the closest to the undisturbed time the profile describes (the bench takes medians of short, ~20 ms
    samples, which mostly fall between the disturbances)."""
    cmd = [tessel, "run", "--backend", "cpu", "--model", model, "--steps", str(steps), "--json"] + layout_flags(l)
    if trace:
        cmd += ["--trace", trace]
    times = [s["seconds"] for s in json.loads(sh(cmd))["steps"]]  # `tessel run --json` (docs/runtime.md)
    if len(times) < steps:
        sys.stderr.write("closed_loop: %d step times for %d steps from %s\n" % (len(times), steps, " ".join(cmd)))
        sys.exit(1)
    return min(times[2:] if len(times) > 2 else times)


def kendall_tau(a, b):
    """Kendall's tau-a over all pairs (ties count as neither concordant nor discordant)."""
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            s += (x * y > 0) - (x * y < 0)
    pairs = n * (n - 1) / 2
    return s / pairs if pairs else 1.0


def engine_of(tessel, wanted):
    if wanted != "auto":
        return wanted
    r = subprocess.run([tessel, "simulate", "--help"], capture_output=True, text=True)
    return "simulate" if r.returncode == 0 else "estimate"


def one_repeat(args, rep, engine, model_path, layouts):
    load_before = os.getloadavg()[0]  # other work on the machine shares the cores: reported with the numbers
    d = os.path.join(args.out, "rep%d" % rep)
    os.makedirs(d, exist_ok=True)
    bench = os.path.join(d, "bench.json")
    # GEMM and memory kernels on 2 threads at once: the per-rank rate with both cores busy.
    bench_cmd = [args.tessel, "bench", "--backend", "cpu", "--json", "--concurrent", "2"]
    if args.quick:
        bench_cmd += ["--what", "gemm,collectives"]
    sh(bench_cmd, bench)
    trace = os.path.join(d, "calib_trace.json")
    measure(args.tessel, model_path, CALIB, args.steps, trace)
    profiles = {"bench": os.path.join(d, "profile_bench.json"), "bench+trace": os.path.join(d, "profile.json")}
    sh([args.tessel, "calibrate", "--bench", bench, "--base-system", "cpu", "-o", profiles["bench"], "--json"],
       os.path.join(d, "calibrate_bench.json"))
    sh([args.tessel, "calibrate", "--bench", bench, "--trace", trace, "--base-system", "cpu", "-o", profiles["bench+trace"],
        "--json"], os.path.join(d, "calibrate.json"))
    rows = []
    for l in layouts:
        row = {"layout": l["name"], "measured_s": measure(args.tessel, model_path, l, args.steps)}
        for key, prof in profiles.items():
            row["predicted_s_" + key] = predict(args.tessel, engine, model_path, prof, l)
        rows.append(row)
    summary = {}
    for key in profiles:
        errs = [r["predicted_s_" + key] / r["measured_s"] - 1 for r in rows]
        for r, e in zip(rows, errs):
            r["error_pct_" + key] = 100 * e
        summary[key] = {
            "median_abs_error_pct": 100 * statistics.median(abs(e) for e in errs),
            "kendall_tau": kendall_tau([r["predicted_s_" + key] for r in rows], [r["measured_s"] for r in rows]),
        }
    return {"repeat": rep, "engine": engine, "rows": rows, "summary": summary, "load_before": load_before,
            "load_after": os.getloadavg()[0]}


def print_repeat(res):
    print("repeat %d (prediction: tessel %s; load average before %.2f, after %.2f)" % (
        res["repeat"], res["engine"], res["load_before"], res["load_after"]))
    print("%-24s %10s %12s %8s %12s %8s" % ("layout", "measured", "pred(bench)", "err", "pred(+trace)", "err"))
    for r in res["rows"]:
        print("%-24s %8.1fms %10.1fms %7.1f%% %10.1fms %7.1f%%" % (
            r["layout"], 1e3 * r["measured_s"], 1e3 * r["predicted_s_bench"], r["error_pct_bench"],
            1e3 * r["predicted_s_bench+trace"], r["error_pct_bench+trace"]))
    for key, s in res["summary"].items():
        print("  %-12s median |error| %5.1f%%   Kendall tau %.3f" % (key, s["median_abs_error_pct"], s["kendall_tau"]))
    sys.stdout.flush()


def write_svg(results, key, path):
    """Predicted vs measured step time (log-log), one colour per repeat, the y = x line and +-10% band."""
    pts = [(r["measured_s"], r["predicted_s_" + key], i) for i, res in enumerate(results) for r in res["rows"]]
    lo = min(min(m, p) for m, p, _ in pts) / 1.5
    hi = max(max(m, p) for m, p, _ in pts) * 1.5
    W, H, M = 420, 420, 50
    import math

    def xy(m, p):
        fx = (math.log(m) - math.log(lo)) / (math.log(hi) - math.log(lo))
        fy = (math.log(p) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return M + fx * (W - 2 * M), H - M - fy * (H - 2 * M)

    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>']
    for f, dash in ((1.0, ""), (1.1, ' stroke-dasharray="4,3"'), (1 / 1.1, ' stroke-dasharray="4,3"')):
        (x0, y0), (x1, y1) = xy(lo, lo * f), xy(hi / f if f > 1 else hi, (hi / f if f > 1 else hi) * f)
        out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888"%s/>' % (x0, y0, x1, y1, dash))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (M, M, W - 2 * M, H - 2 * M))
    for m, p, i in pts:
        x, y = xy(m, p)
        out.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s" fill-opacity="0.8"/>' % (x, y, colours[i % len(colours)]))
    out.append('<text x="%d" y="%d" text-anchor="middle">measured step time (log, %.0f ms .. %.0f ms)</text>' % (W / 2, H - 15, 1e3 * lo, 1e3 * hi))
    out.append('<text x="15" y="%d" transform="rotate(-90 15 %d)" text-anchor="middle">predicted (profile: %s)</text>' % (H / 2, H / 2, key))
    out.append('<text x="%d" y="30" text-anchor="middle">closed loop: y = x solid, +-10%% dashed; colour = repeat</text>' % (W / 2))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessel", default="tessel", help="the tessel executable")
    ap.add_argument("--out", default="closed_loop_out", help="folder for bench, profiles, traces, results.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first 2 are warm-up)")
    ap.add_argument("--engine", default="auto", choices=["auto", "simulate", "estimate"])
    ap.add_argument("--quick", action="store_true", help="tiny model, 3 layouts, 1 repeat: mechanics only (CI)")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps = 1, 3
    os.makedirs(args.out, exist_ok=True)
    model_path = os.path.join(args.out, "model.json")
    with open(model_path, "w") as f:
        json.dump(QUICK_MODEL if args.quick else MODEL, f, indent=2)
    engine = engine_of(args.tessel, args.engine)
    layouts = QUICK_HELD_OUT if args.quick else HELD_OUT
    results = []
    for rep in range(args.repeats):
        results.append(one_repeat(args, rep, engine, model_path, layouts))
        print_repeat(results[-1])
    overall = {}
    for key in results[0]["summary"]:
        med = [r["summary"][key]["median_abs_error_pct"] for r in results]
        tau = [r["summary"][key]["kendall_tau"] for r in results]
        overall[key] = {"median_abs_error_pct": med, "kendall_tau": tau}
        print("%-12s over %d repeats: median |error| %s %%, Kendall tau %s" % (
            key, len(results), " ".join("%.1f" % m for m in med), " ".join("%.3f" % t for t in tau)))
    for key in results[0]["summary"]:
        write_svg(results, key, os.path.join(args.out, "scatter_%s.svg" % key.replace("+", "_")))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"loadavg_end": os.getloadavg(), "model": MODEL if not args.quick else QUICK_MODEL, "calibration_layout": CALIB, "repeats": results,
                   "overall": overall, "targets": {"median_abs_error_pct": 10, "kendall_tau": 0.8}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
