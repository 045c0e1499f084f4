#!/usr/bin/env bash
# The one prepared device check (about 8 minutes on one H200; docs/cuda.md, "The device check"). Four modes:
#
#   tools/device-check.sh prepare     HERE (the development machine): collects the header-only and static
#                                      dependencies the device image lacks (it has nvcc, cmake, ninja, meson
#                                      from pip, PyTorch; no Debian packages) into .devdeps/ (git-ignored via
#                                      .git/info/exclude): nlohmann/json, doctest, the Boost.Graph headers
#                                      Tessel includes, zlib.h/zconf.h and libz.a, plus a CMake config for
#                                      nlohmann_json so meson finds it without pkg-config. Nothing is
#                                      downloaded: everything is copied from this machine's /usr.
#   tools/device-check.sh prepare-bin HERE: builds build-devbin (CUDA, no MPI, no BLAS: nothing the device
#                                      image lacks) and copies tessel and the CUDA test/bench executables
#                                      into .devbin/ (git-ignored). Carried instead of .devdeps, the device
#                                      runs them and skips its ~3 min build: device time is the scarce part.
#   tools/device-check.sh dry-run     HERE, no GPU: the device part below end to end, with tessel and the
#                                      GPU runtime tests built over the fake CUDA (tests/cuda_fake: the CPU
#                                      kernels), small models in place of the 1.3B and GPT-3 ones, and the
#                                      kernel tests and sweeps as they are here (exit 77, no device). It
#                                      checks the script's flow and its reading of the programs' output
#                                      before a device session spends its minutes on it. BUILD names the
#                                      build folder (default build); output in device-dry/.
#   tools/device-check.sh             ON THE DEVICE (device tool: carry [".devdeps"] or [".devbin"]): builds
#                                      with CUDA in build-device, runs the GPU tests (the multi-rank ones as
#                                      threads on the one GPU), the GEMM/attention/bandwidth sweeps, an
#                                      8192^3 GEMM held for 15 s in bf16 and fp8 with the SM clock, one-GPU
#                                      training of tiny (also tp2 pp2 dp2 zero1 under --gpu-threads against
#                                      the CPU backend, pp2 dp2 zero3 with its state memory, and a
#                                      checkpoint resumed under another layout), of tiny-moe (tp2 sp dp2
#                                      ep4 under --gpu-threads against the CPU backend) and of
#                                      a ~1.3B GPT with traces and the kernel profile (the default attention
#                                      tc, then cudnn and the experimental variants), --only-rank runs of
#                                      GPT-3 175B tp8 pp8 (first and last stage), `tessel bench --backend
#                                      cuda` and its calibration, the closed loop on the GPU (`tessel
#                                      calibrate --closed-loop --backend cuda --gpu-threads`), PyTorch
#                                      eager, SDPA and torch.compile on
#                                      the same shapes, and compute-sanitizer over the attention test, in
#                                      that order of priority. The attention test checks every variant
#                                      against the CPU reference and bench.csv times them: the figures that
#                                      decide the bf16 default (tc or cudnn). Everything lands in $OUT as at
#                                      most 8 files (the tool's limit): summary.txt (the table, printed last
#                                      too), bench.csv, bench-bf16.json, tests.log, runs.log, torch.log,
#                                      traces.tar.gz, build.log.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# Anything but the four modes stops here: a typo must not start the device run (minutes of GPU time).
case "${1:-}" in
  "" | prepare | prepare-bin | dry-run) ;;
  -h | --help | help)
    sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "tools/device-check.sh: unknown mode '$1' (modes: prepare, prepare-bin, dry-run, or none for the run on the device; --help)" >&2
    exit 2
    ;;
esac

if [ "${1:-}" = "prepare" ]; then
  set -e
  d=.devdeps
  rm -rf "$d" && mkdir -p "$d/include" "$d/lib" "$d/cmake/nlohmann_json"
  grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
  cp -r /usr/include/nlohmann /usr/include/doctest "$d/include/"
  cp /usr/include/zlib.h /usr/include/zconf.h "$d/include/"
  cp /usr/lib/x86_64-linux-gnu/libz.a "$d/lib/"
  # Only the Boost headers that Tessel's sources pull in (g++ -M over every boost include we use).
  grep -rhoE '#include <boost/[^>]+>' --include=*.cpp --include=*.hpp sim runtime traces tools models tests | sort -u > "$d/boost_includes.cpp"
  echo '#include <boost/version.hpp>' >> "$d/boost_includes.cpp"
  g++ -std=c++20 -M "$d/boost_includes.cpp" | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
    while read -r f; do mkdir -p "$d/include/$(dirname "${f#/usr/include/}")"; cp "$f" "$d/include/${f#/usr/include/}"; done
  cat > "$d/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" <<'EOF'
# Minimal config for the carried header-only nlohmann/json (tools/device-check.sh prepare).
set(nlohmann_json_VERSION 3.11.2)
if(NOT TARGET nlohmann_json::nlohmann_json)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CMAKE_CURRENT_LIST_DIR}/../../include")
endif()
EOF
  echo 'set(PACKAGE_VERSION 3.11.2)
set(PACKAGE_VERSION_COMPATIBLE TRUE)' > "$d/cmake/nlohmann_json/nlohmann_jsonConfigVersion.cmake"
  du -sh "$d"
  exit 0
fi

if [ "${1:-}" = "prepare-bin" ]; then
  set -e
  grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >> .git/info/exclude
  [ -d build-devbin/meson-private ] ||
    meson setup build-devbin -Dcuda=enabled -Dmpi=disabled -Dblas=disabled -Dbenchmarks=disabled -Dbuildtype=release
  bins="tools/tessel-run tests/cuda/cuda_test_kernels tests/cuda/cuda_test_attention tests/cuda/cuda_test_gemm tests/cuda/cuda_test_gpt_numerics tests/cuda/cuda_test_gpt_multirank tests/cuda/cuda_bench"
  ninja -C build-devbin $bins
  rm -rf .devbin && mkdir -p .devbin
  for b in $bins; do cp "build-devbin/$b" .devbin/; done
  mv .devbin/tessel-run .devbin/tessel  # the runtime executable holds every verb
  (cd .devbin && git -C .. rev-parse --short HEAD > built_from.txt && ldd ./tessel | awk '{print $1}' > needed_libs.txt)
  du -sh .devbin
  exit 0
fi

if [ "${1:-}" = "dry-run" ]; then
  set -e
  b=${BUILD:-build}
  ninja -C "$b" tests/cuda_fake/tessel_fake tests/cuda_fake/cuda_fake_gpt_numerics tests/cuda_fake/cuda_fake_gpt_multirank
  d=$(mktemp -d)
  trap 'rm -rf "$d"' EXIT
  cp "$b/tests/cuda_fake/tessel_fake" "$d/tessel"
  cp "$b/tests/cuda_fake/cuda_fake_gpt_numerics" "$d/cuda_test_gpt_numerics"
  cp "$b/tests/cuda_fake/cuda_fake_gpt_multirank" "$d/cuda_test_gpt_multirank"
  for t in cuda_test_kernels cuda_test_attention cuda_test_gemm cuda_bench; do
    if [ -x "$b/tests/cuda/$t" ]; then cp "$b/tests/cuda/$t" "$d/"
    else printf '#!/bin/sh\necho "no CUDA device (dry run: not built)"\nexit 77\n' > "$d/$t" && chmod +x "$d/$t"; fi
  done
  echo "$(git rev-parse --short HEAD) (dry run: fake CUDA)" > "$d/built_from.txt"
  set +e
  DRY_RUN=1 DEVBIN=$d OUT=${OUT:-$root/device-dry} DEADLINE=${DEADLINE:-600} bash "$0"
  exit $?
fi

# ---------------------------------------------------------------- on the device
OUT=${OUT:-$root/device-out}
# Stages past this many seconds are skipped (the tool's command limit and the session's device time are
# short): what ran is still summarised. DEADLINE overrides.
deadline=${DEADLINE:-470}
start_all=$(date +%s)
left() { echo $(( deadline - ($(date +%s) - start_all) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=0; echo "$want"; }
mkdir -p "$OUT"
for f in summary.txt bench.csv bench-bf16.json tests.log runs.log torch.log traces.tar.gz build.log; do rm -f "$OUT/$f"; done  # a rerun starts clean
work=$(mktemp -d)
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
deps=$root/.devdeps
bin=${DEVBIN:-$root/.devbin}
note "device-check $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD 2>/dev/null || cat "$bin/built_from.txt" 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"
else
  note "gpu: no nvidia-smi on this machine"
fi

if [ -d "$bin" ]; then
  # Prebuilt here (prepare-bin): no build on the device. A shared library the image keeps outside the
  # loader's path (NCCL or cuBLAS inside Python packages, say) is looked up once and added.
  for lib in $(ldd "$bin/tessel" | awk '/not found/ {print $1}'); do
    hit=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
    [ -n "$hit" ] && export LD_LIBRARY_PATH="$(dirname "$hit")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  tessel=$bin/tessel
  tdir=$bin
  # cuDNN is opened at run time by the cudnn attention variant (kernels/cuda/attention_cudnn.cpp), so ldd
  # does not list it: look for it the same way (PyTorch's wheels carry one).
  if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
    hit=$(find /usr/local /opt /usr/lib /root -name 'libcudnn.so.9' 2>/dev/null | head -1)
    [ -n "$hit" ] && export LD_LIBRARY_PATH="$(dirname "$hit")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  note "build: prebuilt $(cat "$bin/built_from.txt" 2>/dev/null) (no MPI, no BLAS); missing libraries: $(ldd "$tessel" | grep -c 'not found')"
  ldd "$tessel" > "$OUT/build.log" 2>&1
  : > "$OUT/tests.log"
  fails=0 skips=0
  for t in cuda_test_kernels cuda_test_attention cuda_test_gemm cuda_test_gpt_numerics cuda_test_gpt_multirank; do
    c=$(cap 120); [ "$c" -eq 0 ] && { echo "skipped $t: time" >> "$OUT/tests.log"; continue; }
    echo "== $t" >> "$OUT/tests.log"
    TESSEL_SOURCE_ROOT=$root timeout "$c" "$tdir/$t" >> "$OUT/tests.log" 2>&1
    rc=$?; echo "rc $rc" >> "$OUT/tests.log"
    case $rc in 0) ;; 77) skips=$((skips + 1)) ;; *) fails=$((fails + 1)) ;; esac
  done
  note "gpu tests: 5 executables, $fails failed, ${skips} skipped (no device)"
else
  [ -d "$deps" ] || { echo "device-check: neither .devbin nor .devdeps: run 'tools/device-check.sh prepare-bin' (or prepare) here and carry it"; exit 2; }
  # 1. Build (about 3 minutes on 16 cores; attention.cu dominates).
  t0=$(date +%s)
  export CMAKE_PREFIX_PATH=$deps/cmake BOOST_INCLUDEDIR=$deps/include
  if ! { meson setup build-device -Dcuda=enabled -Dmpi=disabled -Dblas=disabled -Dbenchmarks=disabled \
           -Dcpp_args="-I$deps/include" -Dcpp_link_args="-L$deps/lib" >"$OUT/build.log" 2>&1 &&
         timeout 300 ninja -C build-device >>"$OUT/build.log" 2>&1; }; then
    note "BUILD FAILED after $(( $(date +%s) - t0 )) s (tail of build.log follows)"; tail -40 "$OUT/build.log"; exit 1
  fi
  note "build: $(( $(date +%s) - t0 )) s"
  tessel=build-device/tools/tessel-run  # every verb, the runtimes included
  tdir=build-device/tests/cuda
  # 2. GPU tests (each kernel vs its CPU reference; the tiny GPT vs the CPU runtime).
  timeout "$(( $(cap 240) + 1 ))" meson test -C build-device --suite cuda --print-errorlogs >"$OUT/tests.log" 2>&1
  note "gpu tests: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUT/tests.log" | tr -s ' ' | paste -sd' ')"
fi
# The machine code the attention kernels became (HOPPER.md: HGMMA is wgmma; a matrix kernel showing only
# HMMA is on mma.sync, FFMA on the CUDA cores), when the image has cuobjdump.
if command -v cuobjdump >/dev/null 2>&1; then
  cuobjdump -sass "$tessel" 2>/dev/null | awk '/Function :/ {f = ($3 ~ /attention/) ? $3 : ""} f != "" && /HGMMA/ {h[f]++}
    f != "" && /HMMA/ && !/HGMMA/ {m[f]++} END {for (k in h) nh++; for (k in m) nm++;
    printf "sass: %d attention kernels with HGMMA (wgmma), %d with HMMA (mma.sync)\n", nh, nm}' | tee -a "$summary"
else
  note "sass: cuobjdump not on this image"
fi

# 3. Training on one GPU: tiny, and a ~1.3B GPT (GPT-2 XL-like: 24 x 2048, vocab 50304, seq 1024).
cat > "$work/gpt-1b.json" <<'EOF'
{"name": "gpt-1.3b", "source": "device-check: GPT-2 XL-like shape at 2048 hidden (24 layers, 16 heads), vocab padded to 50304",
 "params_b": 1.31, "layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn": 8192, "vocab": 50304,
 "seq_len": 1024, "activation": "gelu", "norm": "layernorm", "position": "learned", "tied_embeddings": true,
 "bias": true, "dropout": false}
EOF
g3=gpt3-175b
if [ -n "${DRY_RUN:-}" ]; then  # the same names and flags on shapes the CPU kernels finish
  cat > "$work/gpt-1b.json" <<'EOF'
{"name": "gpt-1.3b", "source": "device-check dry run: small stand-in", "params_b": 0.002, "layers": 2, "hidden": 128,
 "heads": 2, "kv_heads": 2, "ffn": 512, "vocab": 512, "seq_len": 64, "activation": "gelu", "norm": "layernorm",
 "position": "learned", "tied_embeddings": true, "bias": true, "dropout": false}
EOF
  cat > "$work/g3.json" <<'EOF'
{"name": "gpt3-175b", "source": "device-check dry run: small stand-in", "params_b": 0.01, "layers": 16, "hidden": 256,
 "heads": 8, "kv_heads": 8, "ffn": 1024, "vocab": 1024, "seq_len": 64, "activation": "gelu", "norm": "layernorm",
 "position": "learned", "tied_embeddings": true, "bias": true, "dropout": false}
EOF
  g3=$work/g3.json
fi
run() { local c; c=$(cap "$RUN_CAP"); [ "$c" -eq 0 ] && { echo "== skipped (time): $*" >>"$OUT/runs.log"; return; }
       echo "== $*" >>"$OUT/runs.log"; timeout "$c" "$tessel" run --backend cuda "$@" >>"$OUT/runs.log" 2>&1; echo "rc $?" >>"$OUT/runs.log"; }
RUN_CAP=40 run --model tiny --steps 20 --mbs 4 --gbs 8 --trace "$work/tiny.json"
# 3b. Multi-rank code paths on one GPU (ranks as threads, communication staged through the host) against
#     the CPU backend on the same layout, and a recovery checkpoint written and resumed through the CLI.
multi="--model tiny --tp 2 --pp 2 --dp 2 --sp --zero 1 --mbs 2 --gbs 16 --steps 4"
RUN_CAP=40 run $multi --precision fp32 --gpu-threads --trace "$work/tiny_t2p2d2.json"
echo "== cpu backend: $multi" >>"$OUT/runs.log"
timeout "$(( $(cap 40) + 1 ))" "$tessel" run --backend cpu $multi >>"$OUT/runs.log" 2>&1; echo "rc $?" >>"$OUT/runs.log"
note "tiny tp2 pp2 dp2 sp zero1, step 4 loss: gpu-threads $(grep -A6 -- '--gpu-threads --trace' "$OUT/runs.log" | awk '/^step +4 /{print $4}') cpu $(grep -A6 -- '== cpu backend' "$OUT/runs.log" | awk '/^step +4 /{print $4}')"
# 3c. A mixture of experts (tiny-moe: router, all-to-all, a loop of expert GEMMs) on the GPU against the CPU.
moe="--model tiny-moe --tp 2 --sp --dp 2 --ep 4 --etp 1 --mbs 2 --gbs 16 --steps 4"
RUN_CAP=40 run $moe --precision fp32 --gpu-threads --trace "$work/tiny_moe.json"
echo "== cpu backend (moe): $moe" >>"$OUT/runs.log"
timeout "$(( $(cap 40) + 1 ))" "$tessel" run --backend cpu $moe >>"$OUT/runs.log" 2>&1; echo "rc $?" >>"$OUT/runs.log"
note "tiny-moe tp2 sp dp2 ep4, step 4 loss: gpu-threads $(grep -A6 -- '--gpu-threads --trace '"$work"'/tiny_moe' "$OUT/runs.log" | awk '/^step +4 /{print $4}') cpu $(grep -A6 -- '== cpu backend (moe)' "$OUT/runs.log" | awk '/^step +4 /{print $4}')"
RUN_CAP=30 run --model tiny --pp 2 --mbs 2 --gbs 8 --precision fp32 --gpu-threads --steps 2 --save-every 2 --checkpoint-dir "$work/ckpt"
RUN_CAP=30 run --model tiny --tp 2 --mbs 2 --gbs 8 --precision fp32 --steps 4 --gpu-threads --resume "$work/ckpt"
RUN_CAP=30 run --model tiny --pp 2 --mbs 2 --gbs 8 --precision fp32 --gpu-threads --steps 4
RUN_CAP=30 run --model tiny --pp 2 --dp 2 --zero 3 --mbs 2 --gbs 16 --gpu-threads --steps 4 --precision fp32
note "tiny pp2 dp2 zero3 (gpu-threads), step 4 loss $(grep -A9 -- '--zero 3 --mbs' "$OUT/runs.log" | awk '/^step +4 /{print $4}'); $(grep -A9 -- '--zero 3 --mbs' "$OUT/runs.log" | grep '^device memory')"
note "checkpoint pp2 -> tp2 resume, step 4 loss: $(grep -A8 -- '--resume' "$OUT/runs.log" | awk '/^step +4 /{print $4}') vs uninterrupted $(grep -A8 -- '--gpu-threads --steps 4$' "$OUT/runs.log" | awk '/^step +4 /{print $4}')"
RUN_CAP=90 run --model "$work/gpt-1b.json" --mbs 8 --gbs 8 --steps 6 --lr 1e-4 --profile-kernels --trace "$work/gpt1b.json"
note "tessel 1.3B (mbs 8, seq 1024, bf16 GEMMs): $(awk '/gpt-1.3b/{f=1} f && /^step/{l=$0} END{print l}' "$OUT/runs.log")"
note "tessel 1.3B $(awk '/gpt-1.3b/{f=1} f && /^summary:/{print; exit}' "$OUT/runs.log")"
awk '/gpt-1.3b/{f=1} f && /^kernel profile/{p=1} p && /^device memory/{exit} p && !/^summary:/' "$OUT/runs.log" | tee -a "$summary"
# The same step with the other attention variants (--attention-kernel, kernels/cuda/attention_variant.hpp),
# end to end: cudnn first (the candidate for the bf16 default), then the experimental ones. Each run follows
# a marker line of its own in runs.log; attn_log prints that run's lines (up to the next run's "== " line).
attn_log() { awk -v m="== attention variant $1" '$0 == m {f = 1; next} f && /^== / && ++n == 2 {exit} f' "$OUT/runs.log"; }
attn_run() {  # the variant's name
  echo "== attention variant $1" >>"$OUT/runs.log"
  RUN_CAP=60 run --model "$work/gpt-1b.json" --mbs 8 --gbs 8 --steps 4 --lr 1e-4 --profile-kernels --attention-kernel "$1"
  note "tessel 1.3B with attention $1: $(attn_log "$1" | awk '/^step/{l=$0} END{print l}')"
  attn_log "$1" | awk -v l="$1" '/attention_(fwd|bwd)/{print "  " l " " $0; n++} n == 2 {exit}' | tee -a "$summary"
}
for v in cudnn experimental-tc2 experimental-tc3 experimental-tc3-overlap; do attn_run "$v"; done
# 4. PyTorch on the same ~1.3B model and batch: bf16 autocast, median step; eager now, torch.compile last
#    (its compilation is the slowest stage).
cat > "$work/torch_gpt.py" <<'EOF'
import sys, time, json, torch, torch.nn as nn, torch.nn.functional as F
cfg = json.load(open(sys.argv[1])); mode = sys.argv[2]; B = int(sys.argv[3])
L, h, H, f, V, S = cfg["layers"], cfg["hidden"], cfg["heads"], cfg["ffn"], cfg["vocab"], cfg["seq_len"]
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ln1 = nn.LayerNorm(h); s.qkv = nn.Linear(h, 3 * h); s.o = nn.Linear(h, h)
        s.ln2 = nn.LayerNorm(h); s.w1 = nn.Linear(h, f); s.w2 = nn.Linear(f, h)
    def forward(s, x):
        q, k, v = s.qkv(s.ln1(x)).view(x.shape[0], S, 3, H, h // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
        x = x + s.o(a)
        return x + s.w2(F.gelu(s.w1(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__(); s.tok = nn.Embedding(V, h); s.pos = nn.Embedding(S, h)
        s.blocks = nn.ModuleList(Block() for _ in range(L)); s.ln = nn.LayerNorm(h)
    def forward(s, t, y):
        x = s.tok(t) + s.pos.weight[None]
        for b in s.blocks: x = b(x)
        return F.cross_entropy((s.ln(x) @ s.tok.weight.t()).float().view(-1, V), y.view(-1))
torch.manual_seed(0); m = GPT().cuda(); opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
step_fn = torch.compile(m) if mode == "compile" else m
t = torch.randint(0, V, (B, S), device="cuda"); y = torch.randint(0, V, (B, S), device="cuda")
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16): loss = step_fn(t, y)
    loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(3): step()
torch.cuda.synchronize(); ts = []
for _ in range(8):
    a = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append(time.perf_counter() - a)
ts.sort(); ms = ts[len(ts) // 2] * 1e3
flops = 6 * sum(p.numel() for p in m.parameters()) * B * S + 12 * L * h * S * S * B / 2
print(f"torch {mode}: median step {ms:.1f} ms, {B*S/ms*1e3:.0f} tokens/s, {flops/ms/1e9:.1f} TFLOP/s (6N + attention)")
EOF
for mode in eager; do
  c=$(cap 120); [ "$c" -eq 0 ] && { echo "torch $mode skipped (time)" >>"$OUT/torch.log"; continue; }
  timeout "$c" python3 "$work/torch_gpt.py" "$work/gpt-1b.json" $mode 8 >>"$OUT/torch.log" 2>&1 || echo "torch $mode failed or timed out" >>"$OUT/torch.log"
done

# 5. Sweeps: GEMM, attention, bandwidth (bench.csv: kind,name,shape,ms,value,unit).
c=$(cap 100)
if [ "$c" -gt 0 ]; then timeout "$c" "$tdir/cuda_bench" all >"$OUT/bench.csv" 2>>"$OUT/build.log"; else note "sweeps skipped (time)"; fi
copy=$(awk -F, '$1=="bandwidth" && $2=="copy" {print $5}' "$OUT/bench.csv")
note "bandwidth: copy ${copy:-?} GB/s; own kernels (fraction of copy):"
awk -F, -v c="${copy:-1}" '$1=="bandwidth" && $2!="copy" {printf "  %-26s %8.0f GB/s  %.2f\n", $2, $5, $5/c}' "$OUT/bench.csv" | tee -a "$summary"
awk -F, '$1=="gemm" && $3=="8192x8192x8192" && $6=="TFLOP/s" {printf "gemm 8192^3 %-10s %7.1f TFLOP/s\n", $2, $5}' "$OUT/bench.csv" | tee -a "$summary"
# Tessel's bf16 GEMM call over cuBLASLt called directly, per shape (target: within 5%, ratio <= 1.05).
awk -F, '$2=="tessel_over_cublaslt_bf16" {n++; if ($5 > m) {m = $5; at = $3}} END {if (n) printf "gemm tessel / cuBLASLt alone (bf16): worst %.3f at %s over %d shapes\n", m, at, n; else print "gemm tessel / cuBLASLt alone: no rows"}' "$OUT/bench.csv" | tee -a "$summary"
awk -F, '$1=="attention" {printf "attention %-9s %-18s %7.1f TFLOP/s\n", $2, $3, $5}' "$OUT/bench.csv" | tee -a "$summary"
# The bf16 default: tc against cudnn at the 1.3B step's shape (their correctness is tests.log's cuda_attention).
awk -F, '$1=="attention" && $3=="b16_s1024_h16_d128" && $2 ~ /^(fwd|bwd)_(tc|cudnn)_bf16$/ {v[$2]=$5}
  END {printf "attention default (b16 s1024 h16 d128): tc fwd %s bwd %s, cudnn fwd %s bwd %s TFLOP/s\n",
       v["fwd_tc_bf16"], v["bwd_tc_bf16"], v["fwd_cudnn_bf16"], v["bwd_cudnn_bf16"]}' "$OUT/bench.csv" | tee -a "$summary"

# 5a. Sustained GEMMs: one 8192^3 GEMM back to back, 15 s in bf16 then 15 s in fp8 (cuda_bench sustained), the
#     SM clock, power and temperature sampled every 500 ms meanwhile (sustained_clocks.csv, in traces.tar.gz):
#     whether a long run holds the sweep's short-burst rates, which the Hopper presets take
#     (docs/validation.md, "H100 / FP8 rows": every Hopper row 12-20% optimistic).
c=$(cap 40)
if [ "$c" -ge 35 ] && [ -z "${DRY_RUN:-}" ]; then
  smi=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 500 \
      >"$work/sustained_clocks.csv" 2>&1 &
    smi=$!
  fi
  timeout "$c" "$tdir/cuda_bench" sustained 15 >"$work/sustained.csv" 2>>"$OUT/build.log"
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
  grep '^sustained' "$work/sustained.csv" >>"$OUT/bench.csv"
  for k in bf16 fp8_e4m3; do
    awk -F, -v k="$k" '$1=="sustained" && $2==k {n++; v[n]=$5}
      END {if (!n) {print "sustained " k ": no rows"; exit}
           l = 0; m = 0; for (i = n - 4; i <= n; i++) if (i >= 1) {l += v[i]; m++}
           printf "sustained %s 8192^3: first second %.1f TFLOP/s, last five seconds %.1f TFLOP/s (%d s)\n", k, v[1], l / m, n}' \
      "$work/sustained.csv" | tee -a "$summary"
  done
  if [ -s "$work/sustained_clocks.csv" ]; then
    awk -F, '$2+0 > 0 {n++; c[n]=$2+0; p[n]=$3+0; t[n]=$4+0}
      END {if (!n) exit; lo = c[1]; for (i = 1; i <= n; i++) if (c[i] < lo) lo = c[i]
           printf "sustained: SM clock %d MHz at the start, %d at the end, lowest %d; power %.0f W at the end; %d C\n", c[1], c[n], lo, p[n], t[n]}' \
      "$work/sustained_clocks.csv" | tee -a "$summary"
  fi
else
  note "sustained GEMMs skipped (time, or a dry run)"
fi

# 5b. `tessel bench --backend cuda` (the document `tessel calibrate --bench` reads) and the fit of the h200
#     preset from it.
quick=""; [ -n "${DRY_RUN:-}" ] && quick="--quick"  # the fake CUDA's CPU kernels finish only small shapes
c=$(cap 90)
if [ "$c" -gt 0 ]; then
  timeout "$c" "$tessel" bench --backend cuda --precision bf16 $quick --json >"$OUT/bench-bf16.json" 2>>"$OUT/build.log"
  note "tessel bench --backend cuda: rc $?, $(grep -c '"time_us"' "$OUT/bench-bf16.json") rows"
  "$tessel" calibrate --bench "$OUT/bench-bf16.json" --base-system h200 -o "$work/h200-fitted.json" 2>&1 | head -12 | tee -a "$summary"
else
  note "tessel bench --backend cuda skipped (time)"
fi

# 5c. The closed loop on the GPU in one command (docs/calibration.md, "The closed loop"): its own bench, a
#     calibration run, the fit, then the held-out layouts predicted and run with every rank a thread on the one
#     GPU. Its document (closed_loop.json) goes into traces.tar.gz; the summary takes its figures.
c=$(cap 150)
if [ "$c" -gt 0 ]; then
  # --runs 2: the loop's time as this step's cap was sized for (three runs of each layout is the CPU default).
  timeout "$c" "$tessel" calibrate --closed-loop --backend cuda --gpu-threads --runs 2 $quick --out "$work/loop" --json \
    >"$work/closed_loop.json" 2>>"$OUT/build.log"
  note "tessel calibrate --closed-loop --backend cuda --gpu-threads: rc $?"
  python3 - "$work/closed_loop.json" <<'EOF' 2>&1 | tee -a "$summary"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"closed loop: no document ({e})")
for r in d["repeats"]:
    s = r["summary"]
    print(f"closed loop (gpu): median |step error| {s['median_abs_error_pct']:.1f}%, median |op error| "
          f"{s['op_median_abs_error_pct']:.1f}%, Kendall tau {s['kendall_tau']:.3f}, noise: calibration "
          f"{s['calibration_noise_pct']}%, runs {s['measurement_noise_pct']:.1f}%, trusted {s['trusted']}")
    for row in r["rows"]:
        print(f"  {row['layout']:24s} measured {1e3 * row['measured_s']:8.2f} ms  predicted {1e3 * row['predicted_s']:8.2f} ms"
              f"  {row['error_pct']:+6.1f}%")
EOF
else
  note "closed loop skipped (time)"
fi

# 6. GPT-3 175B tp8 pp8, one rank at a time (real shard shapes, communication recorded, not waited).
RUN_CAP=45 run --model "$g3" --tp 8 --pp 8 --mbs 1 --gbs 16 --recompute full --steps 2 --only-rank 0 --trace "$work/g3_r0.json"
RUN_CAP=45 run --model "$g3" --tp 8 --pp 8 --mbs 1 --gbs 16 --steps 2 --only-rank 63 --trace "$work/g3_r63.json"
awk 'function flush() { if (f) print "gpt3-175b tp8 pp8 --only-rank " r ": " s m; f = 0 }
     /^== / { flush() }
     /^== .*--only-rank/ { r = $0; sub(/.*--only-rank /, "", r); sub(/ .*/, "", r); f = 1; s = "no step"; m = ""
                           if ($0 ~ /^== skipped/) { s = "skipped (time)"; flush() }
                           next }
     f && /^step/ { s = $0 }
     f && /^device memory/ { m = "; " $0 }
     f && /^rc / { if ($2 != 0) m = m " (" $0 ")"; flush() }
     END { flush() }' "$OUT/runs.log" | tee -a "$summary"

# 6b. PyTorch's scaled_dot_product_attention (flash backend on Hopper) on the attention sweep's shapes, rows
#     appended to bench.csv in its format: the cost model's attention efficiency and our kernels' yardstick.
cat > "$work/torch_sdpa.py" <<'EOF'
import torch, torch.nn.functional as F
def med(fn, n=10):
    for _ in range(2): fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return sorted(ts)[n // 2]
for S in (512, 1024, 2048, 4096, 8192):
    B, H, D = max(1, 16384 // S), 16, 128
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    flops = 2.0 * B * H * S * S * D  # 4 B H S^2 d, halved by the causal mask (bench_cuda.cpp's count)
    f = med(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True); g = torch.randn_like(o)
    fb = med(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
    shape = f"b{B}_s{S}_h16_d128"
    print(f"attention,fwd_sdpa_bf16,{shape},{f:.4f},{flops / f / 1e9:.2f},TFLOP/s")
    print(f"attention,bwd_sdpa_bf16,{shape},{fb:.4f},{2.5 * flops / fb / 1e9:.2f},TFLOP/s")
EOF
c=$(cap 40)
if [ "$c" -gt 0 ]; then
  timeout "$c" python3 "$work/torch_sdpa.py" >>"$OUT/bench.csv" 2>>"$OUT/torch.log" || echo "torch sdpa failed or timed out" >>"$OUT/torch.log"
  awk -F, '$1=="attention" && $2 ~ /sdpa/ {printf "attention %-14s %-18s %7.1f TFLOP/s\n", $2, $3, $5}' "$OUT/bench.csv" | tee -a "$summary"
fi

# 7. torch.compile on the same model and batch.
for mode in compile; do
  c=$(cap 120); [ "$c" -eq 0 ] && { echo "torch $mode skipped (time)" >>"$OUT/torch.log"; continue; }
  timeout "$c" python3 "$work/torch_gpt.py" "$work/gpt-1b.json" $mode 8 >>"$OUT/torch.log" 2>&1 || echo "torch $mode failed or timed out" >>"$OUT/torch.log"
done
grep '^torch' "$OUT/torch.log" | tee -a "$summary"
# Tessel's median 1.3B step (its summary line) over PyTorch's median step, same batch; for the default
# attention and each other variant (their runs' own summary lines).
for v in default cudnn experimental-tc2 experimental-tc3 experimental-tc3-overlap; do
  if [ "$v" = default ]; then
    tm=$(awk '/gpt-1.3b/{f=1} f && /^summary:/{print $4; exit}' "$OUT/runs.log")
  else
    tm=$(attn_log "$v" | awk '/^summary:/{print $4; exit}')
  fi
  for mode in eager compile; do
    pm=$(awk -v m="$mode:" '$1 == "torch" && $2 == m {print $5; exit}' "$OUT/torch.log")
    if [ -n "$tm" ] && [ -n "$pm" ]; then
      note "1.3B step (attention $v), tessel / torch $mode: $(awk -v a="$tm" -v b="$pm" 'BEGIN {printf "%.2f (%.1f ms / %.1f ms)", a / b, a, b}')"
    else
      note "1.3B step (attention $v), tessel / torch $mode: n/a (tessel ${tm:-missing}, torch ${pm:-missing})"
    fi
  done
done

# 8. compute-sanitizer over the attention variants' test: shared-memory races
#     (racecheck: the cp.async double buffering) and out-of-bounds or misaligned accesses (memcheck).
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in racecheck memcheck; do
    c=$(cap 60); [ "$c" -eq 0 ] && { echo "skipped sanitizer $tool: time" >> "$OUT/tests.log"; continue; }
    echo "== compute-sanitizer --tool $tool cuda_test_attention (bf16 variants)" >> "$OUT/tests.log"
    timeout "$c" compute-sanitizer --tool "$tool" --error-exitcode 9 "$tdir/cuda_test_attention" \
      --test-case='bf16 attention variants*' >> "$OUT/tests.log" 2>&1
    rc=$?; echo "rc $rc" >> "$OUT/tests.log"
    note "compute-sanitizer $tool (bf16 attention variants): rc $rc$( [ $rc -eq 0 ] && echo ' (clean)')"
  done
else
  note "compute-sanitizer: not on this image"
fi

(cd "$work" && tar czf "$OUT/traces.tar.gz" ./*.json $(ls sustained_clocks.csv 2>/dev/null) 2>/dev/null)
echo; echo "==== summary"; cat "$summary"
