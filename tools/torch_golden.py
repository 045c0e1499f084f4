#!/usr/bin/env python3
"""Independent PyTorch reference for Tessel's CPU runtime (tests/golden/tiny_gpt/golden.json).

Builds the same GPT as runtime/params.hpp + runtime/gpt_layer.hpp describe, with the same initial values
(the seeded generator of runtime/init.hpp replicated here in exact integer arithmetic), trains it for a few
AdamW steps on the same synthetic token stream, and writes the per-step losses and, for step 1, each
parameter's gradient norm (before clipping). The C++ test tests/runtime/test_gpt_golden.cpp compares a
single-rank Tessel run against the file, so CI needs no PyTorch.

    pip install torch     # CPU wheel from PyPI
    python3 tools/torch_golden.py --out tests/golden/tiny_gpt/golden.json
    python3 tools/torch_golden.py --model tests/golden/tiny_gpt/tiny_rotary.json \
        --out tests/golden/tiny_gpt/golden_rotary.json

Rotary models (position "rotary") are mirrored with an implementation written here from the paper, not from
the C++: RoFormer (Su et al. 2021, arXiv 2104.09864) in the rotate-half form of GPT-NeoX / HF Llama.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64 increment, as runtime/init.cpp


def mix64(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def tensor_key(seed, name):
    h = 0xcbf29ce484222325
    for c in name.encode():
        h ^= c
        h = (h * 0x100000001b3) & M64
    return mix64(h ^ mix64((seed + GOLDEN) & M64))


def init_uniform(key, n, std):
    """Elements 0..n-1 of runtime/init.cpp init_uniform, computed in double then rounded to float32."""
    import numpy as np
    idx = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(key) + idx * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) / 16777216.0
    return torch.from_numpy(((2.0 * u - 1.0) * (std * math.sqrt(3.0))).astype(np.float32))


def param_specs(m):
    """(name, rows, cols, init, std, decay) in runtime/params.cpp order."""
    h, qd, kd, L = m["hidden"], m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"], m["layers"]
    std, out_std = 0.02, 0.02 / math.sqrt(2.0 * L)
    mat = lambda n, r, c, s: (n, r, c, "uniform", s, True)
    vec = lambda n, c, k: (n, 1, c, k, 0.0, False)
    specs = [mat("embed.tok", m["vocab"], h, std)]
    if m["position"] == "learned":
        specs.append(mat("embed.pos", m["seq_len"], h, std))
    for i in range(L):
        p = f"layers.{i}."
        specs += [vec(p + "ln1.w", h, "ones"), vec(p + "ln1.b", h, "zeros"),
                  mat(p + "attn.wq", h, qd, std), mat(p + "attn.wk", h, kd, std), mat(p + "attn.wv", h, kd, std),
                  vec(p + "attn.bq", qd, "zeros"), vec(p + "attn.bk", kd, "zeros"), vec(p + "attn.bv", kd, "zeros"),
                  mat(p + "attn.wo", qd, h, out_std), vec(p + "attn.bo", h, "zeros"),
                  vec(p + "ln2.w", h, "ones"), vec(p + "ln2.b", h, "zeros"),
                  mat(p + "mlp.w1", h, m["ffn"], std), vec(p + "mlp.b1", m["ffn"], "zeros"),
                  mat(p + "mlp.w2", m["ffn"], h, out_std), vec(p + "mlp.b2", h, "zeros")]
    specs += [vec("final_ln.w", h, "ones"), vec("final_ln.b", h, "zeros")]
    return specs


def make_params(m, seed):
    params = {}
    for name, r, c, kind, std, decay in param_specs(m):
        if kind == "uniform":
            t = init_uniform(tensor_key(seed, name), r * c, std).reshape(r, c)
        else:
            t = torch.full((r, c) if r > 1 else (c,), 1.0 if kind == "ones" else 0.0)
        params[name] = (t.clone().requires_grad_(True), decay)
    return params


def token(key, i, vocab):
    return (mix64((key + (i >> 4)) & M64) % vocab + 3 * i) % vocab


def batch(m, seed, step, gbs):
    key, seq, V = tensor_key(seed, "data"), m["seq_len"], m["vocab"]
    xs, ys = [], []
    for j in range(step * gbs, (step + 1) * gbs):
        xs.append([token(key, j * seq + i, V) for i in range(seq)])
        ys.append([token(key, j * seq + i + 1, V) for i in range(seq)])
    return torch.tensor(xs), torch.tensor(ys)


def rotary_cos_sin(S, d, theta):
    """cos/sin of position * theta^(-2j/d) for j < d/2, repeated for both halves of a head: [S, d].
    Angles in float64, rounded once to float32 (as the C++ table is)."""
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def rotate_half(t):
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat([-t2, t1], dim=-1)


def apply_rotary(t, cos, sin):
    """t: [B, heads, S, d]; y = t cos + rotate_half(t) sin, i.e. each (j, j + d/2) pair turned by its angle."""
    return t * cos + rotate_half(t) * sin


def forward(m, P, x, y):
    g = lambda n: P[n][0]
    B, S = x.shape
    H, K, d = m["heads"], m["kv_heads"], m["head_dim"]
    rotary = m["position"] == "rotary"
    if rotary:
        h = g("embed.tok")[x]
        cos, sin = rotary_cos_sin(S, d, float(m.get("rope_theta", 10000.0)))
    else:
        h = g("embed.tok")[x] + g("embed.pos")[torch.arange(S)]
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(m["layers"]):
        p = f"layers.{i}."
        a = F.layer_norm(h, (m["hidden"],), g(p + "ln1.w"), g(p + "ln1.b"), eps=1e-5)
        q = (a @ g(p + "attn.wq") + g(p + "attn.bq")).view(B, S, H, d).transpose(1, 2)
        k = (a @ g(p + "attn.wk") + g(p + "attn.bk")).view(B, S, K, d).transpose(1, 2)
        v = (a @ g(p + "attn.wv") + g(p + "attn.bv")).view(B, S, K, d).transpose(1, 2)
        if rotary:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        s = s.masked_fill(~mask, float("-inf")).softmax(-1)
        o = (s @ v).transpose(1, 2).reshape(B, S, H * d)
        h = h + o @ g(p + "attn.wo") + g(p + "attn.bo")
        a = F.layer_norm(h, (m["hidden"],), g(p + "ln2.w"), g(p + "ln2.b"), eps=1e-5)
        a = F.gelu(a @ g(p + "mlp.w1") + g(p + "mlp.b1"), approximate="tanh")
        h = h + a @ g(p + "mlp.w2") + g(p + "mlp.b2")
    h = F.layer_norm(h, (m["hidden"],), g("final_ln.w"), g("final_ln.b"), eps=1e-5)
    logits = h @ g("embed.tok").t()
    return F.cross_entropy(logits.reshape(-1, m["vocab"]), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "models", "presets", "tiny.json"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.model) as f:
        m = json.load(f)
    m.setdefault("head_dim", m["hidden"] // m["heads"])
    if m["activation"] != "gelu" or m["norm"] != "layernorm" or m["position"] not in ("learned", "rotary") or not m["tied_embeddings"] or not m["bias"]:
        sys.exit("torch_golden.py: only GELU, LayerNorm, learned positions, tied embeddings and biases are mirrored")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    P = make_params(m, a.seed)
    # Optimizer settings of runtime/optimizer_step.hpp OptimizerConfig defaults.
    opt = torch.optim.AdamW([{"params": [t for t, dec in P.values() if dec], "weight_decay": 0.1},
                             {"params": [t for t, dec in P.values() if not dec], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses, grad_norms = [], {}
    for step in range(a.steps):
        x, y = batch(m, a.seed, step, a.global_batch)
        opt.zero_grad()
        loss = forward(m, P, x, y)
        loss.backward()
        if step == 0:
            grad_norms = {n: float(t.grad.double().norm()) for n, (t, _) in P.items()}
        total = torch.nn.utils.clip_grad_norm_([t for t, _ in P.values()], 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        print(f"step {step} loss {float(loss.detach()):.7f} grad_norm {float(total):.7f}")
    doc = {"generator": "tools/torch_golden.py", "torch_version": torch.__version__, "model": m["name"],
           "position": m["position"],
           "seed": a.seed, "global_batch": a.global_batch, "micro_batch": 1, "steps": a.steps,
           "optimizer": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip_norm": 1.0},
           "losses": losses, "grad_norms_step1": grad_norms}
    if m["position"] == "rotary":
        doc["rope_theta"] = float(m.get("rope_theta", 10000.0))
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
