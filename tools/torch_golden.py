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

    python3 tools/torch_golden.py --model models/presets/tiny-moe.json \
        --out tests/golden/tiny_gpt/golden_moe.json
    python3 tools/torch_golden.py --model tests/golden/tiny_gpt/tiny_moe_sigmoid.json \
        --out tests/golden/tiny_gpt/golden_moe_sigmoid.json

The mixture of experts (tiny-moe: SwiGLU, RMSNorm, no biases, a softmax top-2 router over 8 experts with a
shared expert and the load-balancing loss; tiny_moe_sigmoid.json: DeepSeek-V3's sigmoid, group-limited router)
is written here from its papers as a dense gather per expert
(Shazeer et al. 2017; Fedus et al. 2021 for the balancing loss; DeepSeekMoE, arXiv:2401.06066, for the
shared expert), with none of the C++'s dispatch: no sorting, no all-to-all, no per-expert buffers.

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
    swiglu, bias, moe = m["activation"] == "swiglu", m["bias"], m.get("moe")
    mat = lambda n, r, c, s: (n, r, c, "uniform", s, True)
    vec = lambda n, c, k: (n, 1, c, k, 0.0, False)

    def norm(pfx):
        return [vec(pfx + ".w", h, "ones")] + ([vec(pfx + ".b", h, "zeros")] if m["norm"] == "layernorm" else [])

    specs = [mat("embed.tok", m["vocab"], h, std)]
    if m["position"] == "learned":
        specs.append(mat("embed.pos", m["seq_len"], h, std))
    for i in range(L):
        p = f"layers.{i}."
        specs += norm(p + "ln1")
        specs += [mat(p + "attn.wq", h, qd, std), mat(p + "attn.wk", h, kd, std), mat(p + "attn.wv", h, kd, std)]
        if bias:
            specs += [vec(p + "attn.bq", qd, "zeros"), vec(p + "attn.bk", kd, "zeros"), vec(p + "attn.bv", kd, "zeros")]
        specs.append(mat(p + "attn.wo", qd, h, out_std))
        if bias:
            specs.append(vec(p + "attn.bo", h, "zeros"))
        specs += norm(p + "ln2")
        if is_moe_layer(m, i):
            specs.append(mat(p + "moe.router", h, moe["experts"], std))
            if moe.get("shared_ffn", 0) > 0:
                fs = moe["shared_ffn"]
                specs.append(mat(p + "moe.shared.w1", h, fs, std))
                if swiglu:
                    specs.append(mat(p + "moe.shared.wg", h, fs, std))
                specs.append(mat(p + "moe.shared.w2", fs, h, out_std))
            fe = moe["expert_ffn"]
            for x in range(moe["experts"]):
                q = f"{p}moe.expert.{x}."
                specs.append(mat(q + "w1", h, fe, std))
                if swiglu:
                    specs.append(mat(q + "wg", h, fe, std))
                specs.append(mat(q + "w2", fe, h, out_std))
            continue
        specs.append(mat(p + "mlp.w1", h, m["ffn"], std))
        if bias:
            specs.append(vec(p + "mlp.b1", m["ffn"], "zeros"))
        if swiglu:
            specs.append(mat(p + "mlp.wg", h, m["ffn"], std))
            if bias:
                specs.append(vec(p + "mlp.bg", m["ffn"], "zeros"))
        specs.append(mat(p + "mlp.w2", m["ffn"], h, out_std))
        if bias:
            specs.append(vec(p + "mlp.b2", h, "zeros"))
    specs += norm("final_ln")
    return specs


def is_moe_layer(m, i):
    moe = m.get("moe")
    return bool(moe) and moe.get("experts", 0) > 0 and i not in moe.get("dense_layers", [])


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


def norm(m, P, pfx, t):
    if m["norm"] == "layernorm":
        return F.layer_norm(t, (m["hidden"],), P[pfx + ".w"][0], P[pfx + ".b"][0], eps=1e-5)
    # RMSNorm (Zhang & Sennrich 2019): t / sqrt(mean(t^2) + eps) * w.
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * P[pfx + ".w"][0]


def linear(P, t, w, b=None):
    y = t @ P[w][0]
    return y + P[b][0] if b is not None and b in P else y


def mlp(m, P, pfx, t):
    """A dense MLP: GELU (tanh form) or SwiGLU (Shazeer 2020): silu(t W_g) * (t W_1), then W_2."""
    u = linear(P, t, pfx + "w1", pfx + "b1")
    a = F.silu(linear(P, t, pfx + "wg", pfx + "bg")) * u if m["activation"] == "swiglu" else F.gelu(u, approximate="tanh")
    return linear(P, a, pfx + "w2", pfx + "b2")


ROUTING_MARGIN = [float("inf")]
SELECTION_BIAS = {}  # MoE layer prefix -> [E] bias (auxiliary-loss-free balancing)
STEP_LOAD = {}       # MoE layer prefix -> [E] tokens routed to each expert over the step


def update_selection_bias(rate):
    """After the optimizer step: b_e += rate * sign(mean load - load_e) over the step's tokens (DeepSeek-V3
    Sec. 2.1.2; Megatron-Core's expert-bias update)."""
    for pfx, load in STEP_LOAD.items():
        SELECTION_BIAS[pfx] += rate * torch.sign(load.mean() - load)
    STEP_LOAD.clear()


def moe(m, P, pfx, t):
    """A mixture-of-experts MLP on one micro-batch's tokens t [T, h]: a softmax or sigmoid router (group-limited
    when the experts are grouped), each token's top-k experts weighted by their (renormalised) scores, a shared
    expert every token passes through (DeepSeekMoE), and the Switch Transformer load-balancing loss as Megatron-Core states it:
    aux = coef * E / (k T^2) * sum_e c_e * sum_t p_te, c_e the tokens routed to e (no gradient).
    Returns (output [T, h], aux)."""
    e = m["moe"]
    E, k, T = e["experts"], e["top_k"], t.shape[0]
    r = e.get("router", {})
    logits = t @ P[pfx + "router"][0]
    sigmoid = r.get("score", "softmax") == "sigmoid"
    probs = logits.sigmoid() if sigmoid else logits.softmax(-1)
    # Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias, not trained by the gradient, shifts the
    # scores that choose the experts; the chosen experts' weights come from the scores themselves.
    choose = probs.detach() + SELECTION_BIAS[pfx] if pfx in SELECTION_BIAS else probs
    G, M = r.get("groups", 1), r.get("group_top_k", 1)
    if G > 1:
        # Group-limited routing (DeepSeek-V2/V3): keep the M groups whose best k // M scores sum highest.
        group_score = choose.view(T, G, E // G).topk(k // M, dim=-1).values.sum(-1)
        keep = torch.zeros(T, G, dtype=torch.bool).scatter(1, group_score.topk(M, dim=-1).indices, True)
        choose = choose.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    top = choose.topk(min(k + 1, E), dim=-1)
    idx = top.indices[:, :k]
    # How near the choice is to flipping under rounding: the gap between the k-th and the next score (and the
    # groups' likewise). The C++ side rounds differently (~1e-7); a gap far above that keeps both choices equal.
    margin = float((top.values[:, k - 1] - top.values[:, k]).min().detach()) if k < E else float("inf")
    if G > 1 and M < G:
        gs = group_score.topk(M + 1, dim=-1).values
        margin = min(margin, float((gs[:, M - 1] - gs[:, M]).min().detach()))
    ROUTING_MARGIN[0] = min(ROUTING_MARGIN[0], margin)
    w = probs.gather(1, idx)
    if r.get("normalize_top_k", True):
        w = w / w.sum(-1, keepdim=True)
    w = w * r.get("scale", 1.0)
    out = torch.zeros_like(t)
    for x in range(E):
        tok, slot = (idx == x).nonzero(as_tuple=True)
        if tok.numel():
            out = out.index_add(0, tok, w[tok, slot].unsqueeze(-1) * mlp(m, P, f"{pfx}expert.{x}.", t[tok]))
    if e.get("shared_ffn", 0) > 0:
        out = out + mlp(m, P, pfx + "shared.", t)
    counts = torch.bincount(idx.reshape(-1), minlength=E).to(probs.dtype)
    if pfx in SELECTION_BIAS:
        STEP_LOAD[pfx] = STEP_LOAD.get(pfx, 0) + counts
    aux = r.get("aux_loss_coef", 0.0) * E / (k * T * T) * (counts * probs.sum(0)).sum()
    return out, aux


def forward(m, P, x, y):
    """One micro-batch: (LM loss, load-balancing loss summed over the MoE layers)."""
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
    aux = torch.zeros(())
    for i in range(m["layers"]):
        p = f"layers.{i}."
        a = norm(m, P, p + "ln1", h)
        q = linear(P, a, p + "attn.wq", p + "attn.bq").view(B, S, H, d).transpose(1, 2)
        k = linear(P, a, p + "attn.wk", p + "attn.bk").view(B, S, K, d).transpose(1, 2)
        v = linear(P, a, p + "attn.wv", p + "attn.bv").view(B, S, K, d).transpose(1, 2)
        if rotary:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        s = s.masked_fill(~mask, float("-inf")).softmax(-1)
        o = (s @ v).transpose(1, 2).reshape(B, S, H * d)
        h = h + linear(P, o, p + "attn.wo", p + "attn.bo")
        a = norm(m, P, p + "ln2", h)
        if is_moe_layer(m, i):
            out, layer_aux = moe(m, P, p + "moe.", a.reshape(B * S, -1))
            h = h + out.view(B, S, -1)
            aux = aux + layer_aux
        else:
            h = h + mlp(m, P, p + "mlp.", a)
    h = norm(m, P, "final_ln", h)
    logits = h @ g("embed.tok").t()
    return F.cross_entropy(logits.reshape(-1, m["vocab"]), y.reshape(-1)), aux


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
    if m["position"] not in ("learned", "rotary") or not m["tied_embeddings"] or m.get("mla") or m.get("mtp_layers", 0) \
            or m.get("sliding_window", 0) or any(k in m for k in ("qkv_bias", "out_bias", "mlp_bias")):
        sys.exit("torch_golden.py: mirrors learned or rotary positions, tied embeddings and one bias flag only")
    e = m.get("moe", {})
    r = e.get("router", {})
    if e and (r.get("logit_bias") or e.get("shared_gate") or e.get("expert_bias") or m["bias"]
              or (r.get("score") == "sigmoid" and r.get("aux_loss_coef", 0))):
        sys.exit("torch_golden.py: a mixture of experts is mirrored without a logit bias, shared gate "
                 "or biases, and a sigmoid router without the load-balancing loss")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    P = make_params(m, a.seed)
    if r.get("selection_bias"):
        for i in range(m["layers"]):
            if is_moe_layer(m, i):
                SELECTION_BIAS[f"layers.{i}.moe."] = torch.zeros(e["experts"])
    # Optimizer settings of runtime/optimizer_step.hpp OptimizerConfig defaults.
    opt = torch.optim.AdamW([{"params": [t for t, dec in P.values() if dec], "weight_decay": 0.1},
                             {"params": [t for t, dec in P.values() if not dec], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    # A dense model's loss is the mean over every token of the batch, whatever its micro-batches; the
    # load-balancing loss is per micro-batch (its counts and T are the micro-batch's), so a MoE model runs
    # micro-batches of one sequence, as the C++ test does, and both losses are their mean.
    micro = 1 if e else a.global_batch
    n_mb = a.global_batch // micro
    losses, aux_losses, grad_norms = [], [], {}
    for step in range(a.steps):
        x, y = batch(m, a.seed, step, a.global_batch)
        opt.zero_grad()
        lm, aux = torch.zeros(()), torch.zeros(())
        for j in range(0, a.global_batch, micro):
            l_mb, a_mb = forward(m, P, x[j:j + micro], y[j:j + micro])
            lm, aux = lm + l_mb / n_mb, aux + a_mb / n_mb
        loss = lm
        (lm + aux).backward()
        if step == 0:
            grad_norms = {n: float(t.grad.double().norm()) for n, (t, _) in P.items()}
        total = torch.nn.utils.clip_grad_norm_([t for t, _ in P.values()], 1.0)
        opt.step()
        if r.get("selection_bias"):
            update_selection_bias(r.get("bias_update_rate", 1e-3))
        losses.append(float(loss.detach()))
        aux_losses.append(float(aux.detach()))
        print(f"step {step} loss {float(loss.detach()):.7f}" + (f" aux {float(aux.detach()):.7f}" if r.get("aux_loss_coef", 0) else "") +
              f" grad_norm {float(total):.7f}")
    doc = {"generator": "tools/torch_golden.py", "torch_version": torch.__version__, "model": m["name"],
           "position": m["position"],
           "seed": a.seed, "global_batch": a.global_batch, "micro_batch": 1, "steps": a.steps,
           "optimizer": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip_norm": 1.0},
           "losses": losses, "grad_norms_step1": grad_norms}
    if e and r.get("aux_loss_coef", 0):
        doc["aux_losses"] = aux_losses
    if SELECTION_BIAS:
        doc["selection_bias_final"] = {p + "bias": [float(v) for v in b] for p, b in SELECTION_BIAS.items()}
    if e:
        doc["min_routing_margin"] = ROUTING_MARGIN[0]
        print(f"smallest routing margin {ROUTING_MARGIN[0]:.3g}")
    if m["position"] == "rotary":
        doc["rope_theta"] = float(m.get("rope_theta", 10000.0))
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
