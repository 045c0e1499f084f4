// The CUDA runtime's run (run_cuda, the library call of `tessel run --backend cuda`) on the fake CUDA
// runtime: the rules it enforces before any rank starts (each an InputError naming the flag and the rule),
// what it reports (steps, every rank's memory, checkpoints saved and resumed), and a --gpu-threads run of
// four ranks that writes a recovery checkpoint and a merged trace, then resumes under another layout.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "kernels/cuda/kernels.hpp"
#include "util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/cuda/gpu_trainer.hpp"
#include "runtime/cuda/run_cuda.hpp"
#include "runtime/trainer.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/cuda/staged_comm.hpp"
#include "runtime/rank_groups.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/system.hpp"
#include "traces/chrome.hpp"
#include "traces/compare.hpp"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

rt::cuda::CudaRunOptions options(int tp, int pp, int dp) {
  rt::cuda::CudaRunOptions o;
  o.model = load_model("tiny");
  o.layout.tp = tp;
  o.layout.pp = pp;
  o.layout.dp = dp;
  o.layout.micro_batch = 2;
  o.layout.global_batch = 16;
  o.layout.precision = Precision::fp32;
  o.precision = "fp32";
  o.steps = 2;
  return o;
}

// The report of a run that must succeed, and of its one reporting process.
rt::cuda::CudaRunResult run_ok(const rt::cuda::CudaRunOptions& o) {
  rt::cuda::CudaRunResult r = rt::cuda::run_cuda(o);
  REQUIRE(r.reports);
  return r;
}

// The reported step `step` (1-based), or nullptr when the run did not train it.
const rt::StepRecord* step_of(const rt::cuda::CudaRunResult& r, int step) {
  for (const rt::StepRecord& s : r.steps)
    if (s.step == step) return &s;
  return nullptr;
}

std::string error_of(const rt::cuda::CudaRunOptions& o) {
  try {
    rt::cuda::run_cuda(o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("run_cuda rejects what it cannot run, naming the flag and the rule") {
  auto o = options(2, 1, 1);  // two ranks, one process, no --gpu-threads
  CHECK(error_of(o).find("needs 2 GPU processes") != std::string::npos);
  o = options(2, 1, 1);
  o.only_rank = 1;
  o.save_every = 1;
  o.checkpoint_dir = (std::filesystem::temp_directory_path() / "tessel-never-written").string();
  CHECK(error_of(o).find("--only-rank") != std::string::npos);
  o = options(2, 1, 1);
  o.only_rank = 5;
  CHECK(error_of(o).find("--only-rank 5") != std::string::npos);
  o = options(2, 1, 1);
  o.only_rank = 0;
  o.gpu_threads = true;
  CHECK(error_of(o).find("--gpu-threads") != std::string::npos);
  o = options(1, 1, 1);
  o.precision = "fp16";
  CHECK(error_of(o).find("--precision fp16") != std::string::npos);
  // A mixture of experts: what this runtime does not build yet is named, before any device work.
  const auto moe = [](int tp, int ep, int etp) {
    auto m = options(tp, 1, 2);
    m.model = load_model("tiny-moe");
    m.layout.sequence_parallel = tp > 1;
    m.layout.ep = ep;
    m.layout.etp = etp;
    m.gpu_threads = true;
    return m;
  };
  const std::string lacks = "not yet with a mixture of experts on the CUDA runtime";
  o = moe(1, 2, 1);
  o.layout.zero_stage = 2;
  CHECK(error_of(o).find("--zero 2 (ZeRO-1 shards the experts' states over edp): " + lacks) != std::string::npos);
  o = moe(2, 2, 0);
  o.only_rank = 1;
  o.gpu_threads = false;
  CHECK(error_of(o).find("--only-rank: " + lacks) != std::string::npos);
}

// tiny-moe over four ranks (tp 2 with SP, dp 2): ep 4 with each expert whole, and ep 2 with each expert split
// over etp 2. The losses the CPU runtime trains, and a measured trace whose all-to-alls (dispatch and combine,
// forward and backward, per MoE layer and micro-batch) and expert gathers / reduce-scatters align op by op
// with the simulator's, so compare and calibrate see them.
TEST_CASE("--gpu-threads trains a mixture of experts as the CPU runtime does, and its trace carries the all-to-alls") {
  const fs::path dir = fs::temp_directory_path() / ("tessel-fake-moe-" + std::to_string(::getpid()));
  for (const int etp : {1, 2}) {
    CAPTURE(etp);
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto o = options(2, 1, 2);
    o.model = load_model("tiny-moe");
    o.layout.sequence_parallel = true;
    o.layout.ep = 4 / etp;
    o.layout.etp = etp;
    o.gpu_threads = true;
    o.trace_path = (dir / "trace.json").string();
    const rt::cuda::CudaRunResult r = run_ok(o);
    const auto cpu = rt::train_threads(o.model, o.layout, {}, 2);
    for (int step = 1; step <= 2; ++step) {
      CAPTURE(step);
      const rt::StepRecord* s = step_of(r, step);
      REQUIRE(s);
      CHECK(s->loss == doctest::Approx(cpu.steps[step - 1].loss).epsilon(1e-5));
      REQUIRE(s->aux_loss);
      CHECK(*s->aux_loss == doctest::Approx(cpu.steps[step - 1].aux_loss).epsilon(1e-5));
    }
    const trace::Trace measured = trace::read_chrome_trace(o.trace_path);
    std::map<int, int> a2a;
    for (const auto& e : measured.events)
      if (e.op == "ep_alltoall") ++a2a[e.rank];
    REQUIRE(a2a.size() == 4);
    // 3 MoE layers x 4 exchanges x the micro-batches, each of 2 steps.
    for (const auto& [rank, n] : a2a) CHECK(n == 2 * 3 * 4 * o.layout.num_microbatches());
    const System sys = load_system("h200");
    const trace::Trace st = engine::to_trace(engine::simulate(o.model, o.layout, sys), sys);
    int simulated = 0;
    for (const auto& e : st.events) simulated += e.op == "ep_alltoall";
    CHECK(simulated > 0);
    const trace::Comparison c = trace::compare_traces(st, measured);
    std::string only_sim;
    for (const auto& x : c.only_in_a) only_sim += x.op + " x" + std::to_string(x.count) + " ";
    CAPTURE(only_sim);
    CHECK(c.matched == c.events_a);  // every simulated op, the expert gathers and reduce-scatters included
    int matched = 0;
    for (const auto& p : c.pairs) matched += st.events[p.a].op == "ep_alltoall";
    CHECK(matched == simulated);
  }
  fs::remove_all(dir);
  // ZeRO-1: the dense Adam moments shard over dp 2 and the experts' (most of this model's) over edp 2, so every
  // rank's moments halve (unsharded experts would leave 82% of them).
  std::vector<std::int64_t> moments;
  for (const int z : {0, 1}) {
    auto o = options(2, 1, 2);
    o.model = load_model("tiny-moe");
    o.layout.sequence_parallel = true;
    o.layout.ep = 2;
    o.layout.etp = 1;
    o.layout.zero_stage = z;
    o.gpu_threads = true;
    o.steps = 1;
    const rt::cuda::CudaRunResult r = run_ok(o);
    REQUIRE(r.memory.size() == 4);
    moments.push_back(r.memory[0].optimizer_bytes);
  }
  CHECK(double(moments[1]) / double(moments[0]) == doctest::Approx(0.5).epsilon(0.01));
}

// --only-rank: one rank of a larger layout alone, weights and inputs synthesised, every communication
// recorded with its bytes on its lane and neither run nor waited for (there are no peers).
TEST_CASE("--only-rank plays one rank of tp2 pp2 alone and records its communication without running it") {
  const fs::path trace = fs::temp_directory_path() / ("tessel-fake-only-" + std::to_string(::getpid()) + ".json");
  auto o = options(2, 2, 1);
  o.layout.sequence_parallel = true;
  o.only_rank = 3;  // tp rank 1 of the last pipeline stage: receives activations, sends gradients back
  o.trace_path = trace.string();
  const rt::cuda::CudaRunResult r = run_ok(o);
  CHECK(r.start.world_rank == 3);
  CHECK(r.start.comm == "none");
  REQUIRE(r.memory.size() == 1);  // this rank alone
  CHECK(r.memory[0].rank == 3);
  CHECK(r.trace_file == o.trace_path);
  const trace::Trace t = trace::read_chrome_trace(o.trace_path);
  CHECK(r.trace_events == t.events.size());
  int recv = 0, send = 0, tp = 0, compute = 0, tp_in_layer = 0;
  for (const auto& e : t.events) {
    CHECK(e.rank == 3);
    if (e.stream == trace::Stream::pp && e.op == "recv") recv += e.bytes > 0;
    if (e.stream == trace::Stream::pp && e.op == "send") send += e.bytes > 0;
    if (e.stream == trace::Stream::tp) tp += e.bytes > 0;
    // Inside a layer a collective carries that layer alone, as the simulator's trace (one per layer).
    if (e.stream == trace::Stream::tp) tp_in_layer += e.layer_end - e.layer_begin == 1;
    if (e.stream == trace::Stream::compute && (e.op == "forward" || e.op == "backward")) ++compute;
  }
  // Every micro-batch of both steps (global batch 16 / micro-batch 2: 8 a step) is received, computed
  // forward and backward, and its input gradient sent back.
  const int mbs = o.layout.num_microbatches() * o.steps;
  CHECK(recv == mbs);
  CHECK(send == mbs);
  CHECK(compute == 2 * mbs);
  CHECK(tp > 0);
  CHECK(tp_in_layer > 0);
  CHECK(tp_in_layer < tp);  // the head's vocab-parallel collectives keep the stage's range
  fs::remove(trace);
}

// --only-rank under ZeRO-3: each layer's group "gathered" (synthesised) as the stage reaches it, in the
// forward and again in the backward, and each of the stage's groups reduce-scattered once per micro-batch;
// both recorded on the dp lane with their bytes.
TEST_CASE("--only-rank under ZeRO-3 records a gather per layer and use, and a reduce-scatter per group and micro-batch") {
  const fs::path trace = fs::temp_directory_path() / ("tessel-fake-only-z3-" + std::to_string(::getpid()) + ".json");
  auto o = options(1, 2, 2);
  o.layout.zero_stage = 3;
  o.only_rank = 3;  // dp rank 1 of the last stage: layers 4-7, the final norm and the tied head
  o.trace_path = trace.string();
  const rt::cuda::CudaRunResult r = run_ok(o);
  const trace::Trace t = trace::read_chrome_trace(o.trace_path);
  int gathers = 0, reduces = 0;
  for (const auto& e : t.events) {
    if (e.stream != trace::Stream::dp) continue;
    CHECK(e.bytes > 0);
    gathers += e.op == "dp_allgather";
    reduces += e.op == "dp_reducescatter";
  }
  const int mbs = o.layout.num_microbatches() * o.steps, groups = 4 + 2;  // four layers, "final", "embed.tok"
  CHECK(gathers == 2 * groups * mbs);
  CHECK(reduces == groups * mbs);
  // ZeRO-3 over dp 2: this rank holds a shard of the values, gradients and moments, its memory reported.
  REQUIRE(r.memory.size() == 1);
  CHECK(r.memory[0].parameter_bytes > 0);
  CHECK(r.memory[0].device_peak_bytes.value_or(0) >= r.memory[0].parameter_bytes);
  // One stage with the tied head: embed.tok's gradient (head and lookup) is reduced once a micro-batch,
  // with the embeddings', not once for each: 8 layers, "final", "embed.tok", "embed.pos".
  o = options(1, 1, 2);
  o.layout.zero_stage = 3;
  o.only_rank = 1;
  o.trace_path = trace.string();
  (void)run_ok(o);
  reduces = 0;
  for (const auto& e : trace::read_chrome_trace(o.trace_path).events)
    reduces += e.stream == trace::Stream::dp && e.op == "dp_reducescatter";
  CHECK(reduces == 11 * o.layout.num_microbatches() * o.steps);
  fs::remove(trace);
}

// --only-rank under bf16 ZeRO-1 (sharded fp32 values): after each step every group's exchange is recorded,
// not run: groups exchanged in bf16 need no compute work (AdamW wrote this rank's chunk of the copy), and
// a group gathered in fp32 is synthesised in place of the gather and still turned into the bf16 copy, so
// the timed work is the real run's; one reduce-scatter and one all-gather per group and step are recorded.
TEST_CASE("--only-rank under bf16 ZeRO-1 records a reduce-scatter and an all-gather per group and step") {
  const fs::path trace = fs::temp_directory_path() / ("tessel-fake-only-z1-" + std::to_string(::getpid()) + ".json");
  auto o = options(1, 2, 2);
  o.layout.zero_stage = 1;
  o.layout.precision = Precision::bf16;
  o.precision = "bf16";
  o.only_rank = 3;  // the last stage: layers 4-7, "final", the tied "embed.tok"
  o.trace_path = trace.string();
  (void)run_ok(o);
  const trace::Trace t = trace::read_chrome_trace(o.trace_path);
  int gathers = 0, reduces = 0;
  for (const auto& e : t.events) {
    gathers += e.stream == trace::Stream::dp && e.op == "dp_allgather";
    reduces += e.stream == trace::Stream::dp && e.op == "dp_reducescatter";
  }
  CHECK(gathers == 6 * o.steps);
  CHECK(reduces == 6 * o.steps);
  fs::remove(trace);
}

// The fake's stream-order check itself (fake_cudart.cpp): work on one stream, then on another, is a
// violation unless an event recorded after the first was waited for, or the host synchronised with it.
TEST_CASE("fake CUDA: an operation not ordered after another stream's earlier work throws, naming both") {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t e = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  float x[4] = {};
  REQUIRE(cudaMemsetAsync(x, 0, sizeof(x), a) == cudaSuccess);
  CHECK_THROWS_WITH_AS(cudaMemsetAsync(x, 0, sizeof(x), b), doctest::Contains("'cudaMemsetAsync' is not ordered after 'cudaMemsetAsync'"),
                       std::logic_error);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);  // the fence: b waits for what a has issued
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  CHECK_NOTHROW(cudaMemsetAsync(x, 0, sizeof(x), b));
  CHECK_THROWS_AS(cudaMemsetAsync(x, 0, sizeof(x), a), std::logic_error);  // and the other way round
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);  // the host waited for b: what it issues next is after
  CHECK_NOTHROW(cudaMemsetAsync(x, 0, sizeof(x), a));
  cudaEventRecord(e, a);
  cudaStreamWaitEvent(b, e, 0);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// The fake's data check of deferred operations (fake_cudart.cpp): a copy into device memory on one stream
// lands only once something is ordered after it. Another stream reading it first reads NaN; writing its
// source or destination before anything waited for it throws when it lands; waiting makes it land intact.
TEST_CASE("fake CUDA: a deferred copy lands when waited for; read early it is NaN, written early it throws") {
  cudaStream_t compute = nullptr, comm = nullptr;
  cudaEvent_t e = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  float *src = nullptr, *dst = nullptr;
  REQUIRE(cudaMalloc(&src, 4 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&dst, 4 * sizeof(float)) == cudaSuccess);
  const float host[4] = {1, 2, 3, 4};
  const std::size_t before = fake_overlapped_ops();
  // Landed in order: a copy's own stream is ordered after it.
  REQUIRE(cudaMemcpyAsync(src, host, sizeof(host), cudaMemcpyHostToDevice, comm) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(dst, src, sizeof(host), cudaMemcpyDeviceToDevice, comm) == cudaSuccess);
  CHECK(std::isnan(dst[0]));  // in flight: nothing has waited for it
  // A later copy on the same stream that shares no memory with it orders that stream only: still in flight.
  float other[4] = {};
  REQUIRE(cudaMemcpyAsync(other, host, sizeof(host), cudaMemcpyHostToDevice, comm) == cudaSuccess);
  CHECK(std::isnan(dst[0]));
  REQUIRE(cudaMemsetAsync(nullptr, 0, 0, compute) == cudaSuccess);  // compute work beside it: not a violation
  CHECK(fake_overlapped_ops() == before + 1);
  REQUIRE(cudaEventRecord(e, comm) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(compute, e, 0) == cudaSuccess);  // compute waits: it lands
  CHECK(dst[0] == 1.0f);
  CHECK(dst[3] == 4.0f);
  CHECK(other[2] == 3.0f);
  const auto comm_waits_compute = [&] {  // comm work is strict about what compute issued before it
    REQUIRE(cudaEventRecord(e, compute) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(comm, e, 0) == cudaSuccess);
  };
  // The source written (on compute) while a copy from it is in flight on comm.
  comm_waits_compute();
  REQUIRE(cudaMemcpyAsync(dst, src, sizeof(host), cudaMemcpyDeviceToDevice, comm) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(src, 0, sizeof(host), compute) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, comm) == cudaSuccess);
  CHECK_THROWS_WITH_AS(cudaStreamWaitEvent(compute, e, 0),
                       doctest::Contains("'cudaMemcpyAsync' was still in flight when its input was written"), std::logic_error);
  // The destination written before the copy landed.
  comm_waits_compute();
  REQUIRE(cudaMemcpyAsync(dst, host, sizeof(host), cudaMemcpyHostToDevice, comm) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(dst, 0, sizeof(host), compute) == cudaSuccess);
  CHECK_THROWS_WITH_AS(cudaStreamSynchronize(comm),
                       doctest::Contains("'cudaMemcpyAsync host to device' was still in flight when its output was written"),
                       std::logic_error);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // nothing left in flight
  cudaEventDestroy(e);
  cudaFree(src);
  cudaFree(dst);
  cudaStreamDestroy(compute);
  cudaStreamDestroy(comm);
}

// MFU's denominator: the device name picks the system preset, the GEMM precision its peak (the roofline of
// --profile-kernels also its bandwidth); a device no preset describes has none. `tessel run`'s summary line
// (tests/tools/run_json_cli_test.cpp) divides by it.
TEST_CASE("device peaks: the matched preset's dense peak and bandwidth, none for an unknown device") {
  std::string what;
  const System h200 = load_system("dgx-h200");
  CHECK(rt::cuda::device_peak_flops("NVIDIA H200", "bf16", what) == h200.gpu.peak(Precision::bf16));
  CHECK(what == "bf16 dense peak of system preset dgx-h200");
  CHECK(rt::cuda::device_peak_flops("NVIDIA H200", "tf32", what) == h200.gpu.tf32_flops);
  CHECK(rt::cuda::device_peak_flops("NVIDIA A100-SXM4-80GB", "fp32", what) ==
        load_system("dgx-a100").gpu.peak(Precision::fp32));
  CHECK(rt::cuda::device_peak_flops("NVIDIA GeForce RTX 4090", "bf16", what) == 0.0);
  CHECK(what == "no system preset matches device 'NVIDIA GeForce RTX 4090'");
  CHECK(h200.gpu.peak(Precision::bf16) > 9e14);  // the preset's 989 TFLOP/s, not an empty field

  CHECK(rt::cuda::device_memory_bw("NVIDIA H200") == h200.gpu.memory_bw_Bps);
  CHECK(rt::cuda::device_memory_bw("NVIDIA GeForce RTX 4090") == 0.0);
}

// --profile-kernels' work counts (gpu_stage.cpp's TIMED_W), against the model's shapes counted here: each
// GEMM scope's FLOPs (the forward GEMMs once; their input and weight gradients the same again each; the LM
// head three times its forward), causal attention (half the s x s products; the backward 5/2 of the
// forward), and the bytes of one memory-bound kernel. One step of the tiny GPT, two micro-batches.
TEST_CASE("kernel profile: each scope's FLOPs and bytes are the model's") {
  const Model m = load_model("tiny");
  Layout l;
  l.micro_batch = 4;
  l.global_batch = 8;
  l.precision = Precision::fp32;
  rt::cuda::CudaDevice dev(0);
  rt::cuda::GpuTrainOptions opt;
  opt.gemm = kernels::cuda::GemmType::fp32;
  rt::cuda::GpuTrainer t(dev, m, l, opt, nullptr, rt::Recorder::Clock::now());
  dev.set_kernel_profile(true);
  (void)t.step();
  const auto& k = dev.kernel_totals();
  const double mbs = 2, L = m.layers, T = 4.0 * m.seq_len, h = m.hidden, f = m.ffn, V = double(m.vocab);
  const double d = double(m.hidden) / m.heads;
  const double fwd = mbs * L * 2 * T * (4 * h * h + 2 * h * f);  // q, k, v, o; w1, w2 (GELU, no gate)
  REQUIRE(k.count("gemm_fwd"));
  CHECK(k.at("gemm_fwd").flops == doctest::Approx(fwd).epsilon(1e-12));
  CHECK(k.at("gemm_dgrad").flops == doctest::Approx(fwd).epsilon(1e-12));
  CHECK(k.at("gemm_wgrad").flops == doctest::Approx(fwd).epsilon(1e-12));
  CHECK(k.at("gemm_head").flops == doctest::Approx(3 * mbs * 2 * T * h * V).epsilon(1e-12));
  const double attn = mbs * L * 2 * 4.0 * m.heads * double(m.seq_len) * m.seq_len * d;  // 2 GEMMs, masked half
  CHECK(k.at("attention_fwd").flops == doctest::Approx(attn).epsilon(1e-12));
  CHECK(k.at("attention_bwd").flops == doctest::Approx(2.5 * attn).epsilon(1e-12));
  // x2 = partial + x + bias: two [T, h] reads and one write in fp32, the bias once; twice per layer.
  CHECK(k.at("residual_add").calls == std::int64_t(2 * mbs * L));
  CHECK(k.at("residual_add").bytes == doctest::Approx(2 * mbs * L * (12 * T * h + 4 * h)).epsilon(1e-12));
}

// The byte counts of the bf16 path (GEMM operands in bf16, the norms and activations writing them
// directly, the MLP's inner activations and their gradients in bf16) against the shapes: the forward GEMMs'
// operands, C and biases; the norms; GELU forward and backward; the MLP's bias gradient; the cross-entropy
// gradient; AdamW (30 bytes a parameter with the bf16 copy) and zero_grad.
TEST_CASE("kernel profile: the bf16 path's bytes are the model's") {
  const Model m = load_model("tiny");
  Layout l;
  l.micro_batch = 4;
  l.global_batch = 8;
  rt::cuda::CudaDevice dev(0);
  rt::cuda::GpuTrainOptions opt;
  opt.gemm = kernels::cuda::GemmType::bf16_fp32;
  rt::cuda::GpuTrainer t(dev, m, l, opt, nullptr, rt::Recorder::Clock::now());
  dev.set_kernel_profile(true);
  (void)t.step();
  const auto& k = dev.kernel_totals();
  const double mbs = 2, L = m.layers, T = 4.0 * m.seq_len, h = m.hidden, f = m.ffn, V = double(m.vocab);
  // One GEMM y[T, n] = x[T, kk] W[kk, n] (+ b): bf16 operands; fp32 output and bias, or (the MLP's first,
  // out16) bf16 output and bias.
  const auto gemm = [&](double n, double kk, bool bias, bool out16 = false) {
    const double cs = out16 ? 2 : 4;
    return 2 * (T * kk + kk * n) + cs * T * n + (bias ? cs * n : 0);
  };
  const double layer_fwd = 3 * gemm(h, h, true) + gemm(h, h, false) + gemm(f, h, true, true) + gemm(h, f, false);
  CHECK(k.at("gemm_fwd").bytes == doctest::Approx(mbs * L * layer_fwd).epsilon(1e-12));
  // LayerNorm forward writing the bf16 operand only: x read, y written in bf16, mean and rstd, gamma and beta.
  CHECK(k.at("norm_fwd").calls == std::int64_t(mbs * (2 * L + 1)));
  CHECK(k.at("norm_fwd").bytes == doctest::Approx(mbs * (2 * L + 1) * (6 * T * h + 8 * (T + h))).epsilon(1e-12));
  // GELU on bf16: h1 read, the operand written; backward: its gradient and h1 read, the input gradient written.
  CHECK(k.at("activation_fwd").bytes == doctest::Approx(mbs * L * 4 * T * f).epsilon(1e-12));
  CHECK(k.at("activation_bwd").bytes == doctest::Approx(mbs * L * 6 * T * f).epsilon(1e-12));
  // Bias gradients: b1 summed from the bf16 gradient, the attention's q, k, v biases from fp32 ones (2 bytes
  // and 4 a row, every column's sum read and written), b2 and bo from the fp32 residual gradient.
  const double bias_grads = (2 * T * f + 8 * f) + 3 * (4 * T * h + 8 * h) + 2 * (4 * T * h + 8 * h);
  CHECK(k.at("bias_grad").bytes == doctest::Approx(mbs * L * bias_grads).epsilon(1e-12));
  // The logits' gradient: fp32 logits read, bf16 written; targets and the row statistics.
  double ce_bwd = 0;
  for (double b : {6 * T * V + 16 * T, 4 * T}) ce_bwd += mbs * b;  // and the fill of d loss
  CHECK(k.at("cross_entropy_bwd").bytes == doctest::Approx(ce_bwd).epsilon(1e-12));
  double params = 0;
  for (const auto& p : t.params().params()) params += double(p.size());
  CHECK(k.at("optimizer").bytes == doctest::Approx(30 * params).epsilon(1e-12));
  CHECK(k.at("zero_grad").bytes == doctest::Approx(4.0 * double(t.params().padded())).epsilon(1e-12));
  CHECK(k.at("grad_norm").bytes == doctest::Approx(4 * params).epsilon(1e-12));
}

// With attention taking bf16 operands (cudnn and the experimental variants, head dim 64): q, k, v leave their GEMMs in bf16 with
// their biases' bf16 copies, attention reads them (and its output gradient) in bf16 and writes fp32.
TEST_CASE("kernel profile: bf16 attention operands' bytes are the model's") {
  Model m = load_model("tiny");
  m.hidden = 128;
  m.heads = m.kv_heads = 2;
  m.head_dim = 64;
  m.ffn = 512;
  Layout l;
  l.micro_batch = 4;
  l.global_batch = 4;
  rt::cuda::CudaDevice dev(0);
  rt::cuda::GpuTrainOptions opt;
  opt.gemm = kernels::cuda::GemmType::bf16_fp32;
  opt.attention_kernel = "experimental-tc3";
  rt::cuda::GpuTrainer t(dev, m, l, opt, nullptr, rt::Recorder::Clock::now());
  dev.set_kernel_profile(true);
  (void)t.step();
  const auto& k = dev.kernel_totals();
  const double L = m.layers, T = 4.0 * m.seq_len, h = m.hidden, f = m.ffn, qd = h, kd = h, rows = 4.0 * 2 * m.seq_len;
  const auto gemm = [&](double n, double kk, bool bias, bool out16) {
    const double cs = out16 ? 2 : 4;
    return 2 * (T * kk + kk * n) + cs * T * n + (bias ? cs * n : 0);
  };
  CHECK(k.at("gemm_fwd").bytes ==
        doctest::Approx(L * (3 * gemm(h, h, true, true) + gemm(h, h, false, false) + gemm(f, h, true, true) +
                             gemm(h, f, false, false))).epsilon(1e-12));
  CHECK(k.at("attention_fwd").bytes == doctest::Approx(L * (2 * T * (qd + 2 * kd) + 4 * T * qd + 4 * rows)).epsilon(1e-12));
  CHECK(k.at("attention_bwd").bytes == doctest::Approx(L * (T * (12 * qd + 12 * kd) + 8 * rows)).epsilon(1e-12));
}

// The fake NCCL itself (fake_nccl.cpp), which the multi-rank tests lean on: two ranks as threads. Its
// collectives compute NCCL's results in the in-place forms and refuse other overlaps; ncclCommSplit orders
// a color's ranks by key; two ranks that both send first wait for each other and give up with
// ncclSystemError (on GPUs: a hang), while a send issued against its receive goes through.
TEST_CASE("fake NCCL: in-place collectives, split order, and a send that waits for its receive") {
  setenv("TESSEL_FAKE_NCCL_TIMEOUT_S", "0.5", 1);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<std::vector<float>> got(2);
  std::vector<int> split_rank(2, -1), bad_overlap(2, -1), deadlock(2, -1), ok_p2p(2, -1);
  const auto rank = [&](int r) {
    ncclComm_t c = nullptr;
    if (ncclCommInitRank(&c, 2, id, r) != ncclSuccess) return;
    std::vector<float> buf{float(r + 1), float(10 * (r + 1)), 0, 0};  // all-gather in place: slot r of [4]
    std::vector<float> g(4, 0.0f);
    g[std::size_t(2 * r)] = float(r + 1);
    g[std::size_t(2 * r + 1)] = float(10 * (r + 1));
    ncclAllGather(g.data() + 2 * r, g.data(), 2, ncclFloat, c, nullptr);
    std::vector<float> sum{float(r + 1), 2.0f};
    ncclAllReduce(sum.data(), sum.data(), 2, ncclFloat, ncclSum, c, nullptr);
    g.insert(g.end(), sum.begin(), sum.end());
    got[std::size_t(r)] = g;
    ncclComm_t sub = nullptr;  // one color, keys reversing the order
    ncclCommSplit(c, 0, 1 - r, &sub, nullptr);
    if (sub) ncclCommUserRank(sub, &split_rank[std::size_t(r)]);
    ncclCommDestroy(sub);
    // Output overlapping the input at the wrong slot (rank 1 passes slot 0): refused, on every rank.
    bad_overlap[std::size_t(r)] = ncclAllGather(buf.data() + 1, buf.data(), 2, ncclFloat, c, nullptr);
    float x = 1, y = 0;
    deadlock[std::size_t(r)] = ncclSend(&x, 1, ncclFloat, 1 - r, c, nullptr);  // both send first
    ncclComm_t fresh = nullptr;  // the failed calls left the first communicator unusable
    ncclUniqueId id2 = id;
    id2.internal[0] ^= 0x55;
    if (ncclCommInitRank(&fresh, 2, id2, r) != ncclSuccess) return;
    ok_p2p[std::size_t(r)] = r == 0 ? ncclSend(&x, 1, ncclFloat, 1, fresh, nullptr) : ncclRecv(&y, 1, ncclFloat, 0, fresh, nullptr);
    if (r == 1) CHECK(y == 1.0f);
    ncclCommDestroy(fresh);
    ncclCommDestroy(c);
  };
  std::thread a(rank, 0), b(rank, 1);
  a.join();
  b.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(got[std::size_t(r)] == std::vector<float>{1, 10, 2, 20, 3, 4});
    CHECK(split_rank[std::size_t(r)] == 1 - r);
    CHECK(deadlock[std::size_t(r)] == ncclSystemError);
    CHECK(ok_p2p[std::size_t(r)] == ncclSuccess);
  }
  CHECK(bad_overlap == std::vector<int>{ncclSystemError, ncclSystemError});  // neither input is its slot
  unsetenv("TESSEL_FAKE_NCCL_TIMEOUT_S");
}

// The runtime and the cost model agree on what ZeRO moves over dp in a step: the simulator's trace of the
// layout (tessel simulate) against the GPU runtime's measured trace over the fake CUDA, rank by rank, for
// the values exchange (bf16, 2 bytes a parameter, as Megatron's distributed optimizer) and the gradient
// reduce-scatters (fp32; once a step under ZeRO-1, every micro-batch under ZeRO-2). The runtime's extra
// is its layout: chunks padded to 64 elements per rank and the vectors exchanged in fp32.
TEST_CASE("ZeRO-1/2 data-parallel bytes per step: the runtime moves what the simulator prices") {
  const Model m = load_model("tiny");
  const System sys = load_system("h200");
  for (const int z : {1, 2}) {
    Layout l;
    l.pp = 2;
    l.dp = 2;
    l.micro_batch = 2;
    l.global_batch = 8;
    l.zero_stage = z;
    l.precision = Precision::bf16;
    CAPTURE(l.describe());
    // Simulated: per pipeline rank (dp replica 0, tp rank 0), bytes by op kind.
    const engine::SimReport sim = engine::simulate(m, l, sys);
    const trace::Trace st = engine::to_trace(sim, sys);
    std::map<std::pair<int, std::string>, double> want, got;
    for (const trace::OpEvent& e : st.events)
      if (e.stream == trace::Stream::dp && (e.op == "dp_allgather" || e.op == "dp_reducescatter")) {
        const rt::RankCoords c = rt::coords_of(e.rank, l);
        if (c.dp == 0 && c.tp == 0) want[{c.pp, e.op}] += e.bytes;
      }
    // Measured: the second step's events (the first has no values exchange before it).
    std::mutex mu;
    rt::run_threads(l.gpus(), [&](rt::Comm& host) {
      rt::cuda::CudaDevice dev(0);
      rt::cuda::DeviceStagedComm world(host, dev.comm());
      rt::cuda::GpuTrainOptions opt;
      opt.record_trace = true;
      rt::cuda::GpuTrainer t(dev, m, l, opt, &world, rt::Recorder::Clock::now());
      (void)t.step();
      const std::size_t first = t.recorder().events().size();
      (void)t.step();
      const rt::RankCoords c = rt::coords_of(host.rank(), l);
      if (c.dp != 0 || c.tp != 0) return;
      std::lock_guard<std::mutex> lk(mu);
      const auto& ev = t.recorder().events();
      for (std::size_t i = first; i < ev.size(); ++i)
        if (ev[i].stream == trace::Stream::dp) got[{c.pp, ev[i].op}] += ev[i].bytes;
    });
    REQUIRE(want.size() == 4);  // both ops on both pipeline ranks
    for (const auto& kv : want) {  // no structured bindings in CAPTURE (clang 14)
      const int pp = kv.first.first;
      const std::string op = kv.first.second;
      CAPTURE(pp);
      CAPTURE(op);
      CHECK(got[kv.first] >= kv.second);
      CHECK(got[kv.first] <= 1.05 * kv.second);
    }
  }
}
