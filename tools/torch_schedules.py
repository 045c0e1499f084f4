#!/usr/bin/env python3
"""Schedule goldens from PyTorch's own pipeline schedule classes, both ways (tests/golden/schedules/torch/).

  pip install torch==2.15.0            # the CPU wheel from PyPI is enough: no process group is created
  python3 tools/torch_schedules.py --tessel build/tools/tessel --out tests/golden/schedules/torch

1. PyTorch -> Tessel. For every schedule class of torch.distributed.pipelining and a grid of (ranks, micro-batches,
   stages per rank) the class accepts, the schedule's compute-only order (`pipeline_order`, as PyTorch's
   `_dump_csv(format="compute_only")` writes it; GPipe and 1F1B, single-stage classes without `_dump_csv`, written
   the same way with csv.writer) and, for the multi-stage classes, the lowered order with communication that
   `_dump_csv()` writes by default (`compute_comms`: sends, receives, WAIT_SEND_F/B, UNSHARD/RESHARD,
   REDUCE_GRAD/WAIT_REDUCE_GRAD). The manifest records for each file whether every rank's forwards cover
   micro-batches 0..m-1 exactly once: PyTorch 2.15's Schedule1F1B shifts the last rank's forwards by one
   micro-batch (F1..Fm), which Tessel's validator must flag.
2. Tessel -> PyTorch. For every Tessel generator and a grid of shapes, `tessel schedule gen --lower` (the
   current dialect, with waits) is loaded by `_PipelineScheduleRuntime._load_csv(format="compute_comms")`; the
   files that load are committed with the manifest's verdict, so tests/schedule/test_torch_goldens.cpp can
   check without PyTorch that Tessel still writes exactly what PyTorch accepted.

The schedules need no process group: the stage objects below carry only the indices the classes read.
"""
import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed.pipelining.schedules as S


class Stage:
    """What the schedule classes read of a pipeline stage when they build their order."""

    def __init__(self, index, num_stages, rank, ranks):
        self.stage_index = index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = ranks
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.submod = torch.nn.Identity()  # the zero-bubble classes check it is a module


def loss(a, b):
    return a


def csv_text(order):
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for rank in sorted(order):
        w.writerow(["" if a is None else str(a) for a in order[rank]])
    return out.getvalue()


def single(cls, p, m):
    return cls(Stage(0, p, 0, p), m, loss_fn=loss)


def multi(cls, p, m, v):
    n = p * v
    v_shape = cls in (S.ScheduleZBVZeroBubble, S.ScheduleDualPipeV)
    idx = [0, n - 1] if v_shape else [c * p for c in range(v)]
    return cls([Stage(i, n, 0, p) for i in idx], m, loss_fn=loss)


# (class, stages per rank, the (p, m) grid): the shapes each class accepts, small enough to read.
GRID = [
    ("ScheduleGPipe", 1, [(2, 1), (2, 3), (4, 8)]),
    ("Schedule1F1B", 1, [(2, 2), (2, 4), (4, 4), (4, 8)]),
    ("ScheduleLoopedBFS", 2, [(2, 2), (2, 5), (4, 8)]),
    ("ScheduleInterleaved1F1B", 2, [(2, 2), (2, 3), (4, 4), (4, 6), (4, 8), (4, 10)]),
    ("ScheduleInterleaved1F1B", 3, [(4, 3), (4, 6), (4, 8)]),
    ("ScheduleInterleavedZeroBubble", 2, [(2, 4), (4, 8)]),
    ("ScheduleZBVZeroBubble", 2, [(2, 4), (4, 4), (4, 8)]),
    ("ScheduleDualPipeV", 2, [(2, 4), (4, 8), (4, 10)]),
]


def forwards_complete(order, p, m, v):
    """Every stage's forwards are micro-batches 0..m-1, once each (Tessel's rule, checked here independently)."""
    seen = {}
    for rank, actions in order.items():
        for a in actions:
            if a is None:
                continue
            parts = a.sub_actions if a.sub_actions else (a,)
            for x in parts:
                if x.computation_type == S.FORWARD:
                    seen.setdefault(x.stage_index, []).append(x.microbatch_index)
    return all(sorted(seen.get(s, [])) == list(range(m)) for s in range(p * v))


def torch_to_tessel(out):
    rows = []
    for name, v, shapes in GRID:
        cls = getattr(S, name)
        for p, m in shapes:
            base = f"{name}_p{p}_m{m}" + (f"_v{v}" if v > 1 else "")
            sch = single(cls, p, m) if v == 1 else multi(cls, p, m, v)
            files = {"compute_only": base + ".csv"}
            with open(os.path.join(out, files["compute_only"]), "w") as f:
                f.write(csv_text(sch.pipeline_order))
            if v > 1:
                files["compute_comms"] = base + "_comms.csv"
                sch._dump_csv(os.path.join(out, files["compute_comms"]))
            rows.append({"class": name, "pp": p, "microbatches": m, "vpp": v, "files": files,
                         "forwards_complete": forwards_complete(sch.pipeline_order, p, m, v)})
    return rows


TESSEL_GRID = [
    ("gpipe", 1, [(2, 3), (4, 8)]), ("1f1b", 1, [(2, 4), (4, 8)]), ("interleaved", 2, [(2, 4), (4, 8)]),
    ("looped-bfs", 2, [(2, 3), (4, 8)]), ("zb1p", 1, [(2, 4), (4, 8)]), ("zb2p", 1, [(4, 8)]),
    ("zbv", 2, [(2, 4), (4, 8)]), ("dualpipev", 2, [(2, 4), (4, 8)]),
]


def loads_in_torch(path, p, m, v, v_shape):
    n = p * v
    idx = [0, n - 1] if v_shape else [c * p for c in range(v)]
    sch = S._PipelineScheduleRuntime([Stage(i, n, 0, p) for i in idx], m, loss_fn=loss)
    try:
        sch._load_csv(path, format="compute_comms")
        return True, ""
    except Exception as e:  # noqa: BLE001: the verdict is whatever PyTorch raises
        return False, f"{type(e).__name__}: {e}"


def tessel_to_torch(tessel, out):
    rows = []
    for gen, v, shapes in TESSEL_GRID:
        for p, m in shapes:
            name = f"tessel_{gen}_p{p}_m{m}" + (f"_v{v}" if v > 1 else "") + "_lowered.csv"
            path = os.path.join(out, name)
            cmd = [tessel, "schedule", "gen", gen, "--pp", str(p), "--mb", str(m), "--vpp", str(v), "--lower", "-o", path]
            subprocess.run(cmd, check=True, capture_output=True)
            meta = os.path.join(out, name[:-4] + ".meta.json")
            if os.path.exists(meta):
                os.remove(meta)  # PyTorch reads the CSV alone; the test regenerates the sidecar-free text
            ok, why = loads_in_torch(path, p, m, v, gen in ("zbv", "dualpipev"))
            rows.append({"generator": gen, "pp": p, "microbatches": m, "vpp": v, "file": name, "loads": ok,
                         "error": why})
            if not ok:
                print(f"{name}: PyTorch refused it: {why}", file=sys.stderr)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessel", required=True, help="the tessel binary")
    ap.add_argument("--out", required=True, help="golden folder")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    manifest = {"torch_version": torch.__version__.split("+")[0], "torch_to_tessel": torch_to_tessel(a.out),
                "tessel_to_torch": tessel_to_torch(a.tessel, a.out)}
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    refused = [r for r in manifest["tessel_to_torch"] if not r["loads"]]
    print(f"{len(manifest['torch_to_tessel'])} PyTorch schedules, {len(manifest['tessel_to_torch'])} Tessel files, "
          f"{len(refused)} refused by PyTorch")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
