#!/usr/bin/env python3
"""Where do published layouts rank in `tessel explore` for their own model, GPU count and batch?

  tools/explore_fidelity.py --tessel build/tools/tessel --rows ../shared/validation/published.json

For each row that states tp, pp and dp (and a micro-batch), explore runs on the row's model (written to a
temporary model JSON), system preset, GPU count, global batch, sequence and precision, with the row's
software conventions for attention (unfused for 2021-24 Megatron-LM sources, as `tessel validate` does), and
the published layout's best variant (over the fields the row leaves open, and optimizer sharding) is looked
up in the full analytical ranking. Prints a Markdown table: rank, the layout's and the winner's predicted
step times.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SYSTEMS = [("A100", "dgx-a100"), ("H100", "dgx-h100"), ("H800", "h800"), ("H200", "dgx-h200")]


def model_json(row):
    m = row["model"]
    name = (m.get("name") or "row").lower()
    llama = "llama" in name
    if m.get("layers") is None:
        return None
    return {"name": m.get("name") or row["id"], "layers": m["layers"], "hidden": m["hidden"], "heads": m["heads"],
            "kv_heads": m.get("kv_heads") or m["heads"], "ffn": m.get("ffn") or 4 * m["hidden"],
            "vocab": m.get("vocab") or 51200, "seq_len": m.get("seq_len") or 2048,
            "activation": "swiglu" if llama else "gelu", "norm": "rmsnorm" if llama else "layernorm",
            "position": "rotary" if llama else "learned", "tied_embeddings": not llama, "bias": not llama,
            "dropout": not llama}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessel", required=True)
    ap.add_argument("--rows", required=True)
    a = ap.parse_args()
    rows = json.load(open(a.rows))
    seen = set()
    print("| row | published layout | rank in explore's full space | rank within the source's options |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for row in rows:
            lay, hw = row["layout"], row["hardware"]
            if any(lay.get(k) is None for k in ("tp", "pp", "dp", "micro_batch")) or not hw.get("gpu_count"):
                continue
            if (lay.get("ep") or 1) > 1 or isinstance(lay.get("vpp"), str):
                continue
            m = model_json(row)
            if m is None:
                continue
            system = next((s for k, s in SYSTEMS if k in hw["gpu"]), None)
            gbs = lay.get("global_batch") or lay["micro_batch"] * lay["dp"] * (lay.get("num_microbatches") or 1)
            key = (json.dumps(m, sort_keys=True), hw["gpu_count"], gbs, json.dumps(lay, sort_keys=True))
            if key in seen:
                continue
            seen.add(key)
            path = os.path.join(d, "model.json")
            json.dump(m, open(path, "w"))
            rid = row["id"]
            unfused = rid.startswith(("narayanan21", "korthikanti22", "zb24"))
            base = [a.tessel, "explore", "--model", path, "--system", system, "--gpus", str(hw["gpu_count"]),
                   "--gbs", str(gbs), "--no-simulate", "--json", "--top", "1000000",
                   "--precision", "fp8" if lay.get("precision") == "fp8" else "bf16",
                   "--attention", "unfused" if unfused else "flash", "--threads", "2"]
            sched = lay.get("schedule")
            if sched == "interleaved" and lay.get("vpp") == 1:
                sched = "1f1b"  # one chunk per rank is plain 1F1B (as tessel validate reads it)
            # What the source's software offered: its schedules, its optimizer sharding.
            era = (["--schedule", "gpipe,1f1b,interleaved"] if rid.startswith(("narayanan21", "korthikanti22"))
                   else ["--schedule", "1f1b,interleaved,zb1p,zb2p"] if rid.startswith("zb24")
                   else ["--schedule", "1f1b,interleaved"])
            if rid.startswith("narayanan21"):
                era += ["--recompute", "none,full", "--sp", "off"]  # selective recompute and SP came in 2022
            era += ["--zero", "3" if lay.get("zero_stage") == 3 else ("0,1" if rid.startswith("nemo") else "0")]
            ranks = []
            for extra in ([], era):
                out = subprocess.run(base + extra, capture_output=True, text=True)
                if out.returncode != 0:
                    ranks.append((None, None, out.stderr.strip()[:100]))
                    continue
                top = json.loads(out.stdout)["top"]
                ranks.append((rank_of(top, lay, sched), top, None))
            desc = f"tp{lay['tp']} pp{lay['pp']} dp{lay['dp']} mbs{lay['micro_batch']} {sched or ''} {lay.get('recompute') or ''}"
            cells = []
            for rank, top, err in ranks:
                if err:
                    cells.append(f"explore failed: {err}")
                elif rank is None:
                    cells.append(f"not enumerated or infeasible; best {top[0]['describe']} {top[0]['step_s']:.3f} s")
                else:
                    cells.append(f"#{rank}: {top[rank-1]['step_s']:.3f} s vs best {top[0]['describe']} {top[0]['step_s']:.3f} s")
            print(f"| {rid} | {desc} | {cells[0]} | {cells[1]} |")
    return 0


def rank_of(top, lay, sched):
    want = {"tp": lay["tp"], "pp": lay["pp"], "dp": lay["dp"], "cp": lay.get("cp") or 1,
            "micro_batch": lay["micro_batch"]}
    for i, s in enumerate(top):
        l = s["layout"]
        if any(l[k] != v for k, v in want.items()):
            continue
        if sched not in (None, "none") and l["pp"] > 1 and l["schedule"] != sched:
            continue
        if isinstance(lay.get("vpp"), int) and lay["pp"] > 1 and sched == "interleaved" and l["vpp"] != lay["vpp"]:
            continue
        if lay.get("recompute") and l["recompute"] != lay["recompute"]:
            continue
        return i + 1
    return None


if __name__ == "__main__":
    sys.exit(main())
