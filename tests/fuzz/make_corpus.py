#!/usr/bin/env python3
"""Builds the text seeds of tests/fuzz/corpus from the project's own files (presets, goldens, shared data,
the inputs of the unit tests), plus one edge case per format. Binary checkpoint seeds come from
make_fuzz_seeds (the real writer). Run from the repository root: python3 tests/fuzz/make_corpus.py
Deterministic: the same checkout gives the same files."""
import glob
import gzip
import json
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
SHARED = os.path.join(ROOT, "..", "shared")


def put(target, name, text):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def copy(target, path, name=None):
    with open(path, "rb") as f:
        put(target, name or os.path.basename(path), f.read())


def main():
    for p in ["tiny", "llama3-8b", "gpt3-175b", "llama3-405b"]:
        copy("model_json", os.path.join(ROOT, "models", "presets", p + ".json"))
    put("model_json", "zero_layers.json", '{"name":"t","layers":0,"hidden":8,"heads":2,"ffn":32,"vocab":16,'
        '"seq_len":4,"activation":"gelu","norm":"layernorm","position":"learned","tied_embeddings":true,"bias":true}')
    # Inputs of tests/models/model_test.cpp (Llama-2 7B config.json keys, GPT-2 small).
    llama = ('{"architectures":["LlamaForCausalLM"],"hidden_act":"silu","hidden_size":4096,"intermediate_size":11008,'
             '"max_position_embeddings":4096,"model_type":"llama","num_attention_heads":32,"num_hidden_layers":32,'
             '"num_key_value_heads":32,"rms_norm_eps":1e-05,"tie_word_embeddings":false,"vocab_size":32000,'
             '"rope_theta":10000.0}')
    gpt2 = ('{"model_type":"gpt2","n_layer":12,"n_embd":768,"n_head":12,"n_positions":1024,"vocab_size":50257,'
            '"n_inner":null,"activation_function":"gelu_new"}')
    put("hf_config", "llama2-7b.json", llama)
    put("hf_config", "gpt2.json", gpt2)
    put("hf_config", "huge_hidden.json", gpt2.replace('"n_embd":768', '"n_embd":1e30'))
    put("model_json", "hf_llama2-7b.json", llama)
    put("megatron_args", "gpt3_175b.txt",
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --num-layers 96 --hidden-size 12288 "
        "--num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 "
        "--global-batch-size 1536 --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --bf16\n")
    put("megatron_args", "llama_gqa.txt",
        "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --swiglu --vocab-size 32000 "
        "--group-query-attention --num-query-groups 8 --normalization RMSNorm --position-embedding-type rope "
        "--untie-embeddings-and-output-weights --disable-bias-linear --kv-channels 128 --ffn-hidden-size 14336\n")
    put("megatron_args", "zero_layers.txt", "--num-layers 0 --hidden-size 8 --num-attention-heads 2 --seq-length 4 "
        "--vocab-size 16\n")
    for p in sorted(glob.glob(os.path.join(ROOT, "sim", "presets", "*.json"))):
        copy("system_json", p)
    with open(os.path.join(ROOT, "sim", "presets", "dgx-a100.json")) as f:
        sysj = json.load(f)
    sysj["network"]["nic_GBps"] = "NaN"  # JSON has no NaN literal: the closest a file can say
    put("system_json", "nan_bandwidth.json", json.dumps(sysj))
    put("layout_json", "megatron_175b.json", json.dumps(
        {"tp": 8, "pp": 8, "dp": 16, "vpp": 3, "micro_batch": 1, "global_batch": 1536, "schedule": "interleaved",
         "recompute": "full", "sequence_parallel": True, "zero_stage": 1, "precision": "bf16"}))
    put("layout_json", "tiny_pp2.json", json.dumps(
        {"tp": 1, "pp": 2, "dp": 1, "micro_batch": 1, "global_batch": 8, "schedule": "1f1b",
         "stage_layers": [1, 1], "attention": "unfused", "overlap_p2p": True}))
    put("layout_json", "zbv.json", json.dumps(
        {"pp": 2, "vpp": 2, "micro_batch": 1, "global_batch": 8, "schedule": "zbv", "recompute": "selective"}))
    put("layout_json", "1e30_gpus.json", '{"tp":1e30,"micro_batch":1,"global_batch":8}')
    for p in sorted(glob.glob(os.path.join(ROOT, "sim", "stacks", "*.json"))):
        copy("stack_json", p)
    pub = os.path.join(SHARED, "validation", "published.json")
    if os.path.exists(pub):
        with open(pub) as f:
            rows = json.load(f)
        for i in (0, 1, len(rows) // 2, len(rows) - 1):
            put("validation_rows", "published_row_%03d.json" % i, json.dumps([rows[i]]))
    put("validation_rows", "empty.json", "[]")
    for p in sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "schedules", "**", "*.csv"), recursive=True)):
        copy("schedule_csv", p)
    for p in sorted(glob.glob(os.path.join(SHARED, "schedules", "pytorch", "*.csv"))):
        copy("schedule_csv", p, "pytorch_" + os.path.basename(p))
    put("schedule_csv", "huge_mb.csv", "0F999999999\n")
    # A byte order mark, trailing blank lines (both accepted), and a binary cell (refused, shown escaped).
    put("schedule_csv", "bom_trailing_blanks.csv", "\ufeff0F0,0B0\r\n1F0,1B0\r\n\r\n\n")
    put("schedule_csv", "binary_cell.csv", b"0F0,\x01\xff\x80" + b"\xfe" * 200 + b"\n")
    for p in sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "schedules", "**", "*.meta.json"),
                              recursive=True)):
        copy("schedule_meta", p)
    put("schedule_meta", "many_microbatches.meta.json", json.dumps(
        {"schema": 1, "pp": 4, "num_stages": 4, "num_microbatches": 16777216, "stage_to_rank": [0, 1, 2, 3]}))
    # Kineto: the first events of a shared profiler trace (HTA test data), kept small for the fuzzer.
    kin = os.path.join(SHARED, "traces", "kineto", "trace_filter__sampled_rank-0.json.gz")
    if os.path.exists(kin):
        with gzip.open(kin) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        keep = [e for e in events if e.get("cat") in ("kernel", "cuda_runtime", "cpu_op", "user_annotation")][:30]
        small = {k: v for k, v in doc.items() if k != "traceEvents"}
        small["traceEvents"] = keep
        text = json.dumps(small)
        put("kineto_trace", "hta_rank0_first30.json", text)
        put("trace_file", "hta_rank0_first30.json.gz", gzip.compress(text.encode(), mtime=0))
        nccl = [e for e in events if "nccl" in e.get("name", "").lower()][:5]
        small["traceEvents"] = keep[:10] + nccl
        put("kineto_trace", "hta_rank0_nccl.json", json.dumps(small))
    # Reader rules (traces/event_reader.hpp): a time past 2^63 ns, a negative kernel duration.
    put("kineto_trace", "dur_1e300.json", json.dumps(
        {"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0,
                                              "dur": 1e300}]}))
    put("kineto_trace", "negative_dur.json", json.dumps(
        {"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0,
                                              "dur": -5.0}]}))
    put("kineto_trace", "ten_million_ranks.json", json.dumps(
        {"schemaVersion": 1, "distributedInfo": {"rank": 9999999, "world_size": 10000000},
         "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": 1}]}))
    # Tessel Chrome traces: the shapes of tests/traces (op events with identity args, flows, counters, names).
    ev = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0 (stage 0)"}},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "rank 1 (stage 1)"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 2, "args": {"name": "pp"}},
        {"ph": "X", "name": "F s0 mb0", "pid": 0, "tid": 0, "ts": 0.0, "dur": 10.0,
         "args": {"op": "forward", "stage": 0, "chunk": 0, "mb": 0, "layers": [0, 2], "flops": 1e9, "bytes": 4096}},
        {"ph": "X", "name": "send", "pid": 0, "tid": 2, "ts": 10.0, "dur": 2.0,
         "args": {"op": "send", "stage": 0, "chunk": 0, "mb": 0, "bytes": 4096}},
        {"ph": "s", "name": "p2p", "cat": "flow", "id": 1, "pid": 0, "tid": 2, "ts": 10.0},
        {"ph": "X", "name": "recv", "pid": 1, "tid": 2, "ts": 10.0, "dur": 2.0,
         "args": {"op": "recv", "stage": 1, "chunk": 0, "mb": 0, "bytes": 4096}},
        {"ph": "f", "bp": "e", "name": "p2p", "cat": "flow", "id": 1, "pid": 1, "tid": 2, "ts": 10.0},
        {"ph": "X", "name": "F s1 mb0", "pid": 1, "tid": 0, "ts": 12.0, "dur": 10.0,
         "args": {"op": "forward", "stage": 1, "chunk": 0, "mb": 0, "layers": [2, 4], "flops": 1e9, "bytes": 4096}},
        {"ph": "X", "name": "dp_allreduce", "pid": 1, "tid": 3, "ts": 22.0, "dur": 5.0,
         "args": {"op": "dp_allreduce", "bytes": 1048576}},
        {"ph": "C", "name": "memory_GiB", "pid": 0, "tid": 0, "ts": 0.0, "args": {"value": 1.5}},
    ]
    doc = {"traceEvents": ev, "otherData": {"model": "tiny", "schedule": "1f1b", "version": "0.1.0"}}
    put("chrome_trace", "two_ranks_flow.json", json.dumps(doc))
    put("chrome_trace", "bare_array.json", json.dumps(ev[3:5]))
    bad = json.loads(json.dumps(ev[3:4]))
    bad[0]["pid"] = 10000000
    put("chrome_trace", "ten_million_ranks.json", json.dumps(bad))
    # A repeated key (json.dumps cannot write one): the second dur would replace the first.
    put("chrome_trace", "duplicate_dur.json",
        '[{"ph":"X","name":"f","pid":0,"tid":0,"ts":0,"dur":4665.437,"dur":999999.0,"args":{"op":"forward"}}]')
    put("trace_file", "two_ranks_flow.json", json.dumps(doc))
    put("trace_file", "two_ranks_flow.json.gz", gzip.compress(json.dumps(doc).encode(), mtime=0))


if __name__ == "__main__":
    main()
