#!/usr/bin/env python3
"""Parameter counts of mixture-of-experts models as HuggingFace transformers builds them: the golden file
that tests/models/hf_moe_test.cpp compares Tessel's counts against, so CI needs no PyTorch.

Each tests/models/hf_configs/<name>.json is a model's config.json (the keys transformers reads for the shape;
sources in tests/models/hf_configs/README.md). The script builds the model with AutoModelForCausalLM on the
meta device (shapes only: no weight is allocated or downloaded) and counts model.parameters(), which holds a
tied head once. Per layer it records the whole layer and, for its MLP, the routed experts, the router and the
shared experts, read from the modules transformers builds.

    python3 -m venv venv && venv/bin/pip install torch transformers
    venv/bin/python tools/hf_param_counts.py --out tests/models/hf_configs/golden.json

The active count (what one token touches) is not an HF attribute: it is computed here from the module
counts as the total less, on every MoE layer, the routed experts a token does not reach: experts / E x (E - k).
"""
import argparse
import glob
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "tests", "models", "hf_configs")

# Tessel's `tiny-moe` preset (models/presets/tiny-moe.json) written as a config of an HF class of the same
# shape: Glm4MoeForCausalLM is grouped-query attention, RMSNorm, gated MLPs, a leading dense layer
# (first_k_dense_replace) and shared experts of n_shared_experts x moe_intermediate_size, as tiny-moe.
# Its router is a sigmoid where tiny-moe's is a softmax; the router's parameters (one row per expert) are the
# same either way, and its e_score_correction_bias is a buffer, not a parameter.
TINY_MOE_AS_GLM4_MOE = {
    "model_type": "glm4_moe", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 256,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
    "max_position_embeddings": 32, "tie_word_embeddings": True, "attention_bias": False,
    "moe_intermediate_size": 64, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_routed_experts": 8,
    "first_k_dense_replace": 1, "use_qk_norm": False, "partial_rotary_factor": 1.0,
}


def numel(module):
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def first_attr(obj, names):
    for n in names:
        if getattr(obj, n, None) is not None:
            return getattr(obj, n)
    return None


def moe_parts(mlp):
    """Routed experts, router and shared experts of one MoE block, by the names the families use."""
    experts = mlp.experts
    router = first_attr(mlp, ["gate", "router"])
    shared = numel(first_attr(mlp, ["shared_experts", "shared_expert"])) + numel(getattr(mlp, "shared_expert_gate", None))
    return {"experts": numel(experts), "num_experts": experts.num_experts, "router": numel(router), "shared": shared}


def count(config_dict):
    cfg = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    base = model.model
    layers = []
    for layer in base.layers:
        entry = {"params": numel(layer), "attention": numel(layer.self_attn), "mlp": numel(layer.mlp),
                 "moe": hasattr(layer.mlp, "experts")}
        if entry["moe"]:
            entry.update(moe_parts(layer.mlp))
        layers.append(entry)
    total = numel(model)
    top_k = cfg.num_experts_per_tok
    inactive = 0
    for l in layers:
        if l["moe"]:
            per_expert, rem = divmod(l["experts"], l["num_experts"])
            assert rem == 0, "experts' parameters not a multiple of their count"
            inactive += per_expert * (l["num_experts"] - top_k)
    head = 0 if cfg.tie_word_embeddings else numel(model.lm_head)
    return {
        "model_type": cfg.model_type,
        "total": total,
        "active": total - inactive,
        "embedding": numel(base.embed_tokens),
        "head": head,
        "final_norm": numel(base.norm),
        "layers": layers,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(CONFIGS, "golden.json"))
    args = ap.parse_args()
    golden = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}}
    for path in sorted(glob.glob(os.path.join(CONFIGS, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name == "golden":
            continue
        with open(path) as f:
            golden["models"][name] = count(json.load(f))
        print(f"{name}: {golden['models'][name]['total']:,} total, {golden['models'][name]['active']:,} active",
              file=sys.stderr)
    golden["models"]["preset:tiny-moe"] = count(TINY_MOE_AS_GLM4_MOE)
    with open(args.out, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
