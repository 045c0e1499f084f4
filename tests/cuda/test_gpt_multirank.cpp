// Multi-rank layouts of the CUDA runtime on ONE GPU: every rank a thread with its own CudaDevice (streams,
// allocator, GEMM handle) on device 0, communicating through DeviceStagedComm over the thread backend. The
// GpuTrainer code that runs is the one NCCL runs under (tp collectives, vocab-parallel cross-entropy,
// sequence-parallel gradient sums, pipeline send/recv, the tied-embedding pair, the dp reduction); only the
// transport differs. Expected values: the CPU runtime on the same layout (train_threads), the reference
// every GPU test uses; fp32 GEMMs, so the differences are summation order only (the bounds of
// test_gpt_numerics.cpp), on the loss, the global gradient norm and every parameter's gradient norm.
// Recovery checkpoints cross runtimes and layouts both ways. The staged transport buffers sends; on the
// fake CUDA the layouts also run through NcclComm over the fake NCCL, whose sends wait for their receives
// as on GPUs (see that test case). What neither shows: NCCL itself on several GPUs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "kernels/cpu/optimizer.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/params.hpp"
#include "runtime/rank_groups.hpp"
#include "runtime/cuda/gpu_trainer.hpp"
#include "runtime/cuda/nccl_comm.hpp"
#include "runtime/cuda/staged_comm.hpp"
#include "runtime/trainer.hpp"
#include "tests/cuda/tiny_llama.hpp"
#include "tests/test_paths.hpp"
#include "runtime/trainer_checkpoint.hpp"

using namespace tessel;
namespace rc = tessel::rt::cuda;
using tessel::test::tiny_llama;
namespace fs = std::filesystem;

namespace {

constexpr double kLossTolFp32 = 1e-4, kNormTolFp32 = 1e-3;  // fp32 GEMMs (test_gpt_numerics.cpp)

Layout layout(int tp, int pp, int dp, const char* schedule = "1f1b", bool sp = false, int vpp = 1) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.vpp = vpp;
  l.schedule = sched::parse_schedule(schedule, "case");
  l.sequence_parallel = sp;
  l.micro_batch = 2;
  l.global_batch = 16;  // one data stream for every layout, so checkpoints resume across them
  l.precision = Precision::fp32;
  return l;
}

Layout zero(int stage, Layout l) {
  l.zero_stage = stage;
  return l;
}
Layout zero1(Layout l) { return zero(1, l); }
// Expert parallelism over the layout's tp x dp ranks, each expert whole (etp 1) or split over etp ranks.
Layout experts(int ep, Layout l, int etp = 1) {
  l.ep = ep;
  l.etp = etp;
  return l;
}
Layout full_recompute(Layout l) {
  l.recompute = Recompute::full;
  return l;
}
// The layout's overlap switches: pipeline sends that compute does not wait for (overlap_p2p), and none of
// the data-parallel overlap (--no-overlap: every reduction and gather fenced where it is issued).
Layout p2p_overlap(Layout l) {
  l.overlap_p2p = true;
  return l;
}
Layout no_overlap(Layout l) {
  l.overlap_grad_reduce = l.overlap_param_gather = false;
  return l;
}

struct GpuRun {
  std::vector<rt::StepStats> steps;                // rank 0's
  std::vector<std::vector<double>> param_sq;       // per step, per gpt_param_specs() entry: world sum of squares
};

// Whether world rank r's copy of p counts in the world's per-parameter norm (the CPU optimizer's rule):
// dp rank 0 (replicas hold the same reduced gradient; under ZeRO every dp rank its own shard), tp rank 0
// for tp-replicated tensors, and the first stage's copy of an embedding tied across pipeline ranks (every
// schedule here puts stage 0 on pp rank 0).
bool counted(const rt::ParamSpec& p, const Model& m, const Layout& l, int r) {
  rt::RankCoords c = rt::coords_of(r, l);
  rt::expert_coords(c, l);
  // A routed expert's slice: replicated over edp (counted on edp rank 0), or under ZeRO each edp rank's own chunks.
  if (p.expert >= 0) return (l.zero_stage > 0 && l.expert_dp() > 1) || c.edp == 0;
  if (c.dp != 0 && l.zero_stage == 0) return false;
  if (p.shard_dim == -1 && c.tp != 0) return false;
  if (p.name == "embed.tok" && m.tied_embeddings && l.pp > 1 && c.pp != 0) return false;
  return true;
}

// The GPU runtime with every rank a thread on GPU 0; optionally resumes from / saves a recovery checkpoint.
// Also every parameter's gradient norm per step, from each rank's reduced gradient buffer, or under ZeRO
// from its runs of the reduced shard (unclipped: GpuParams::adamw applies the clip as it reads).
// nccl: the ranks talk through NcclComm (only on the fake NCCL: real NCCL takes one GPU per rank).
GpuRun gpu_threads(const Model& m, const Layout& l, int steps, const std::string& resume = "",
                   const std::string& save = "", kernels::cuda::GemmType gemm = kernels::cuda::GemmType::fp32,
                   bool nccl = false) {
  GpuRun out;
  const std::vector<rt::ParamSpec> specs = rt::gpt_param_specs(m);
  std::mutex mu;
  rt::run_threads(l.gpus(), [&](rt::Comm& host) {
    rc::CudaDevice dev(0);
    std::unique_ptr<rt::Comm> world;
    if (nccl) world = std::make_unique<rc::NcclComm>(rc::bootstrap_over(host), dev.comm());
    else world = std::make_unique<rc::DeviceStagedComm>(host, dev.comm());
    rc::GpuTrainOptions opt;
    opt.gemm = gemm;
    rc::GpuTrainer t(dev, m, l, opt, world.get(), rt::Recorder::Clock::now());
    if (!resume.empty()) t.load_checkpoint(resume, opt.seed);
    std::vector<rt::StepStats> mine;
    std::vector<std::vector<double>> sq;
    while (t.steps_done() < steps) {
      mine.push_back(t.step());
      sq.emplace_back(specs.size(), 0.0);
      for (std::size_t k = 0; k < specs.size(); ++k) {
        const std::string& n = specs[k].name;
        rc::GpuParams* store = t.params().has(n) ? &t.params() : t.experts() && t.experts()->has(n) ? t.experts() : nullptr;
        if (!store || !counted(specs[k], m, l, host.rank())) continue;
        for (float v : store->sharded() ? store->download_shard_grad(n) : store->download_grad(n)) sq.back()[k] += double(v) * v;
      }
    }
    if (!save.empty()) t.save_checkpoint(save, opt.seed);
    std::lock_guard<std::mutex> lk(mu);
    if (host.rank() == 0) out.steps = mine;
    if (out.param_sq.empty()) out.param_sq.assign(sq.size(), std::vector<double>(specs.size(), 0.0));
    for (std::size_t i = 0; i < sq.size(); ++i)
      for (std::size_t k = 0; k < specs.size(); ++k) out.param_sq[i][k] += sq[i][k];
  });
  return out;
}

constexpr double kTinyGrad = 1e-7;  // below this a parameter's gradient norm is compared absolutely

// bf16 GEMM operands (and the fused bf16 outputs feeding them) against the fp32 CPU runtime: the tolerances
// of test_gpt_numerics.cpp's bf16 case.
constexpr double kLossTolBf16 = 2e-2, kNormTolBf16 = 5e-2;

void compare(const Model& m, const Layout& l, kernels::cuda::GemmType gemm = kernels::cuda::GemmType::fp32,
             bool nccl = false) {
  CAPTURE(m.name);
  const std::string where = l.describe();
  CAPTURE(where);
  CAPTURE(nccl);
  const bool bf16 = gemm == kernels::cuda::GemmType::bf16_fp32;
  const double loss_tol = bf16 ? kLossTolBf16 : kLossTolFp32, norm_tol = bf16 ? kNormTolBf16 : kNormTolFp32;
  const auto cpu = rt::train_threads(m, l, {}, 3);
  const GpuRun gpu = gpu_threads(m, l, 3, "", "", gemm, nccl);
  REQUIRE(gpu.steps.size() == 3);
  const std::vector<rt::ParamSpec> specs = rt::gpt_param_specs(m);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(std::abs(gpu.steps[i].loss - cpu.steps[i].loss) <= loss_tol * std::abs(cpu.steps[i].loss));
    CHECK(std::abs(gpu.steps[i].grad_norm - cpu.steps[i].grad_norm) <= norm_tol * cpu.steps[i].grad_norm);
    if (m.moe.enabled()) {  // the load-balancing loss, routed on the host by the same code (moe_route)
      CHECK(cpu.steps[i].aux_loss > 0);
      CHECK(std::abs(gpu.steps[i].aux_loss - cpu.steps[i].aux_loss) <= loss_tol * cpu.steps[i].aux_loss);
    }
    // Per parameter: a missing sequence-parallel sum of a norm weight or bias barely moves the global norm.
    REQUIRE(cpu.steps[i].param_grad_norms.size() == specs.size());
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const double got = std::sqrt(gpu.param_sq[std::size_t(i)][k]), want = cpu.steps[i].param_grad_norms[k];
      CAPTURE(specs[k].name);
      CAPTURE(got);
      CAPTURE(want);
      CHECK(std::abs(got - want) <= norm_tol * std::max(want, kTinyGrad));
    }
  }
}

// The CPU runtime resumed from `dir` under layout l and run to `steps`: rank 0's steps after the checkpoint.
std::vector<rt::StepStats> cpu_resumed(const Model& m, const Layout& l, const std::string& dir, int steps) {
  std::vector<rt::StepStats> tail;
  std::mutex mu;
  rt::run_threads(l.gpus(), [&](rt::Comm& world) {
    rt::Trainer t(m, l, {}, world, rt::Recorder::Clock::now());
    rt::load_checkpoint(t, dir, 1234);
    std::vector<rt::StepStats> mine;
    while (t.steps_done() < steps) mine.push_back(t.step());
    std::lock_guard<std::mutex> lk(mu);
    if (world.rank() == 0) tail = mine;
  });
  return tail;
}

struct TempDir {
  fs::path p;
  explicit TempDir(const char* name) : p(fs::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()))) {
    fs::remove_all(p);
  }
  ~TempDir() { fs::remove_all(p); }
};

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("tensor parallelism on the GPU matches the CPU runtime: vocab-parallel cross-entropy, sequence parallelism") {
  compare(load_model("tiny"), layout(2, 1, 1));
  compare(load_model("tiny"), layout(2, 1, 1, "1f1b", true));  // SP: norm gradients summed over tp
  compare(tiny_llama(), layout(2, 1, 1, "1f1b", true));
}

TEST_CASE("pipeline and data parallelism on the GPU match the CPU runtime, tied embeddings across stages included") {
  compare(load_model("tiny"), layout(1, 2, 1));               // tied embed.tok on ranks 0 and 1
  compare(load_model("tiny"), layout(1, 2, 1, "interleaved", false, 2));
  compare(tiny_llama(), layout(1, 2, 1));                     // untied
  compare(load_model("tiny"), layout(1, 1, 2));
  compare(load_model("tiny"), layout(2, 2, 2, "1f1b", true));  // eight ranks on one GPU
  // Zero bubble: I queues the weight GEMMs, W runs them later (a W that did nothing leaves the weight
  // gradients at zero; one run twice doubles them).
  compare(load_model("tiny"), layout(1, 2, 1, "zb1p"));
  compare(tiny_llama(), layout(1, 2, 1, "zbv", false, 2));
  compare(load_model("tiny"), layout(2, 2, 1, "dualpipev", true, 2));
}

// A mixture of experts (tiny-moe: 8 experts, top-2, a shared expert, layer 0 dense): the router GEMM in fp32,
// the routing on the host by the CPU runtime's code, the slots gathered and sent to their experts' ranks,
// each local expert a loop of GEMMs over its rows, the outputs back and summed per token; expert gradients
// reduced over edp. Every routed expert's, the router's and the shared expert's gradient norm is compared.
TEST_CASE("a mixture of experts on the GPU matches the CPU runtime: ep 1, 2, 4, etp 2 with tp, pp, dp, recomputation and split backward") {
  const Model moe = load_model("tiny-moe");
  compare(moe, layout(1, 1, 1));
  compare(moe, experts(2, layout(1, 1, 2)));                             // two experts' ranks, edp 1
  compare(moe, experts(4, layout(2, 1, 2, "1f1b", true)));               // tp 2 + SP folded into ep 4
  compare(moe, experts(2, layout(2, 1, 2, "1f1b", true)));               // ep 2, edp 2: expert gradients reduced
  compare(moe, experts(2, layout(1, 2, 2, "interleaved", false, 2)));    // the all-to-alls inside pipeline chunks
  compare(moe, full_recompute(experts(2, layout(1, 2, 2))));             // routed and exchanged again in backward
  compare(moe, experts(2, layout(1, 2, 2, "zb1p")));                     // expert weight GEMMs deferred to W
  compare(moe, experts(2, layout(1, 1, 2)), kernels::cuda::GemmType::bf16_fp32);
  // Expert tensor parallelism: each expert's FFN over 2 ranks, its rows gathered before and reduce-scattered after.
  compare(moe, experts(2, layout(2, 1, 2, "1f1b", true), 2));            // etp 2 = tp (Megatron-Core's default)
  compare(moe, experts(1, layout(2, 1, 1, "1f1b", true), 2));
  compare(moe, full_recompute(experts(2, layout(2, 2, 2, "1f1b", true), 2)));
  // ZeRO-1: the dense states sharded over dp, the experts' over edp (2 here), values gathered after the step.
  compare(moe, zero1(experts(2, layout(2, 1, 2, "1f1b", true))));
  compare(moe, zero1(experts(2, layout(1, 2, 4))), kernels::cuda::GemmType::bf16_fp32);
}

// ZeRO-1 on the GPU: gradients reduce-scattered over dp, AdamW on each rank's shard of the flat buffer
// (shards cut through tensors), values all-gathered; against the CPU runtime's ZeRO-1.
TEST_CASE("bf16 GEMMs under tensor parallelism match the CPU runtime within bf16 tolerance, with and without SP") {
  // Without SP the norms write the bf16 operand directly; with SP they write fp32 rows that are all-gathered
  // and then converted; the vocab-parallel head writes its logits' gradient in bf16.
  const auto bf16 = kernels::cuda::GemmType::bf16_fp32;
  compare(load_model("tiny"), layout(2, 1, 1), bf16);
  compare(load_model("tiny"), layout(2, 2, 1, "1f1b", true), bf16);
  compare(tiny_llama(), layout(2, 1, 1, "1f1b", true), bf16);
}

TEST_CASE("ZeRO-1 on the GPU matches the CPU runtime") {
  compare(load_model("tiny"), zero1(layout(1, 1, 2)));
  compare(load_model("tiny"), zero1(layout(2, 2, 2, "1f1b", true)));
  compare(tiny_llama(), zero1(layout(1, 2, 2)));
}

// Plain data parallelism and ZeRO-1 reduce each bucket when the step's last micro-batch has closed every
// window of it on the rank (the count comes from the rank's stages): split backward (the layers' buckets
// close in W), and V-shaped placements where the tied embedding's bucket is closed by the first and the
// last stage of one rank (twice a micro-batch).
TEST_CASE("data-parallel bucket reductions under split and V-shaped schedules match the CPU runtime") {
  const Model tiny = load_model("tiny");
  compare(tiny, layout(1, 2, 2, "zb1p"));
  compare(tiny, layout(1, 2, 2, "dualpipev", false, 2));
  compare(tiny, zero1(layout(1, 2, 2, "dualpipev", false, 2)));
  compare(tiny_llama(), zero1(layout(1, 2, 2, "zbv", false, 2)));
}

// ZeRO-2/3 on the GPU: per-group gradients reduce-scattered after every micro-batch's weight gradient
// (the tied embedding and SP sums then on the shards), ZeRO-3's groups gathered around each forward and
// input gradient; against the CPU runtime's ZeRO-2/3. Split backward (zb1p: I makes the norm gradients,
// W the weight gradients), two stages on one rank (interleaved; DualPipeV and zbv with the tied
// embedding's group used by the first and the last stage of the same rank), SP with tp peers' equal shards.
TEST_CASE("ZeRO-2 and ZeRO-3 on the GPU match the CPU runtime") {
  const Model tiny = load_model("tiny");
  compare(tiny, zero(2, layout(1, 1, 2)));
  compare(tiny, zero(2, layout(2, 2, 2, "1f1b", true)));
  compare(tiny, zero(3, layout(1, 1, 2)));
  compare(tiny, zero(3, layout(2, 2, 2, "1f1b", true)));
  compare(tiny, zero(3, layout(1, 2, 2, "zb1p")));
  compare(tiny, zero(3, layout(1, 2, 2, "interleaved", false, 2)));
  compare(tiny_llama(), zero(3, layout(1, 2, 2, "dualpipev", false, 2)));
  compare(tiny_llama(), zero(2, layout(2, 1, 2, "1f1b", true)), kernels::cuda::GemmType::bf16_fp32);
  compare(tiny, zero1(layout(1, 2, 2)), kernels::cuda::GemmType::bf16_fp32);  // the fp32 values sharded too
  // Tied and V-shaped: rank 0's last stage head re-opens embed.tok's gradient (in W, after a split I)
  // after its first stage's embedding backward reduced it.
  compare(tiny, zero(2, layout(1, 2, 2, "dualpipev", false, 2)));
  compare(tiny, zero(3, layout(1, 2, 2, "zbv", false, 2)), kernels::cuda::GemmType::bf16_fp32);
  compare(tiny, zero(3, layout(2, 2, 2, "1f1b", true)), kernels::cuda::GemmType::bf16_fp32);
}

// Saved after step 2 on one runtime and layout, resumed on the other runtime under another layout and run
// to step 4: step 3's loss and norm check the weights and the data position, step 4's also the restored
// AdamW moments and step count (step 3's update used them).
TEST_CASE("recovery checkpoints cross between the GPU and CPU runtimes and between layouts") {
  const Model m = load_model("tiny");
  const Layout a = layout(2, 2, 1, "1f1b", true), b = layout(1, 2, 2);
  const Layout c = zero1(layout(1, 2, 2));  // the GPU's sharded moments, gathered to save, sliced to load
  const Layout c2 = zero(2, layout(2, 1, 2, "1f1b", true)), c3 = zero(3, layout(1, 2, 2));  // ZeRO-3: values too
  const auto whole = rt::train_threads(m, b, {}, 4);
  const auto check_tail = [&](const std::vector<double>& loss, const std::vector<double>& norm) {
    REQUIRE(loss.size() == 2);
    for (int i = 0; i < 2; ++i) {
      CAPTURE(i + 2);
      CHECK(std::abs(loss[i] - whole.steps[i + 2].loss) <= kLossTolFp32 * whole.steps[i + 2].loss);
      CHECK(std::abs(norm[i] - whole.steps[i + 2].grad_norm) <= kNormTolFp32 * whole.steps[i + 2].grad_norm);
    }
  };
  const auto gpu_tail = [&](const Layout& g, const std::string& dir) {
    const GpuRun r = gpu_threads(m, g, 4, dir);
    REQUIRE(r.steps.size() == 2);
    CHECK(r.steps[0].step == 2);
    check_tail({r.steps[0].loss, r.steps[1].loss}, {r.steps[0].grad_norm, r.steps[1].grad_norm});
  };
  {
    TempDir dir("tessel-gpu-ckpt-a");
    (void)gpu_threads(m, a, 2, "", dir.p.string());  // GPU, tp2 pp2 sp -> CPU, pp2 dp2
    const std::vector<rt::StepStats> tail = cpu_resumed(m, b, dir.p.string(), 4);
    REQUIRE(!tail.empty());
    CHECK(tail.front().step == 2);  // resumed after step 2
    std::vector<double> loss, norm;
    for (const auto& st : tail) {
      loss.push_back(st.loss);
      norm.push_back(st.grad_norm);
    }
    check_tail(loss, norm);
  }
  {
    TempDir dir("tessel-gpu-ckpt-b");
    rt::run_threads(b.gpus(), [&](rt::Comm& world) {  // CPU, pp2 dp2 -> GPU, tp2 pp2 sp and GPU ZeRO-1
      rt::Trainer t(m, b, {}, world, rt::Recorder::Clock::now());
      for (int i = 0; i < 2; ++i) (void)t.step();
      rt::save_checkpoint(t, dir.p.string(), 1234);
    });
    for (const Layout& g : {a, c, c2, c3}) {
      const std::string where = g.describe();
      CAPTURE(where);
      gpu_tail(g, dir.p.string());
    }
  }
  {
    TempDir dir("tessel-gpu-ckpt-c");
    (void)gpu_threads(m, c, 2, "", dir.p.string());  // GPU ZeRO-1 -> GPU tp2 pp2 sp
    gpu_tail(a, dir.p.string());
  }
  {
    TempDir dir("tessel-gpu-ckpt-d");
    (void)gpu_threads(m, c3, 2, "", dir.p.string());  // GPU ZeRO-3 -> GPU ZeRO-2 tp2 sp, and tp2 pp2 sp
    gpu_tail(c2, dir.p.string());
    gpu_tail(a, dir.p.string());
  }
}

// Under bf16 GEMMs ZeRO-1/2 keep the fp32 values sharded, and a checkpoint gathers them group by group; a
// load rebuilds the bf16 copy and the fp32 vectors from them. Saved at step 2 and resumed, the run
// continues the uninterrupted one (the same GPU arithmetic both ways), also when resumed under ZeRO-2.
// Auxiliary-loss-free balancing on the GPU (tiny_moe_bias.json: DeepSeek-V3's sigmoid, group-limited router,
// 16 experts, top-4, a selection bias moved by 0.01 x sign(mean load - load) after each step). With fp32
// GEMMs, after 5 steps every rank holds PyTorch's biases (golden_moe_bias.json, tools/torch_golden.py; exact,
// as the CPU runtime's test: sums of +-0.01 whose signs follow the same routed tokens): one rank, tp 2 x dp 2
// x ep 4 (the load summed over dp), ZeRO-1 (the master values whole on every rank); the losses are the CPU
// runtime's. Under bf16 GEMMs with ZeRO-1 the master values are sharded, so the update must reach the owner's
// shard, which the exchange after the step carries: every rank holds the biases of the same run without ZeRO
// (bf16 moves routing decisions within the golden's 2e-5 margin, so PyTorch's fp32 values are not the reference).
TEST_CASE("the selection bias on the GPU follows PyTorch's after 5 steps, on one rank, tp 2 x dp 2 x ep 4 and ZeRO-1") {
  const std::string dir = test::source_root() + "/tests/golden/tiny_gpt/";
  const Model m = load_model(dir + "tiny_moe_bias.json");
  REQUIRE(m.moe.router.selection_bias);
  std::ifstream in(dir + "golden_moe_bias.json");
  REQUIRE(in.good());
  const auto g = nlohmann::json::parse(in);
  const auto& want = g.at("selection_bias_final");
  using Biases = std::map<std::string, std::vector<float>>;
  struct Run {
    std::vector<Biases> bias;  // per rank
    std::vector<double> losses;
  };
  const auto batch = [&](Layout l) {
    l.micro_batch = 1;
    l.global_batch = g.at("global_batch").get<int>();  // the golden's batch: the load is the step's tokens
    return l;
  };
  const auto run = [&](const Layout& l, kernels::cuda::GemmType gemm) {
    Run out;
    out.bias.resize(std::size_t(l.gpus()));
    std::mutex mu;
    rt::run_threads(l.gpus(), [&](rt::Comm& host) {
      rc::CudaDevice dev(0);
      rc::DeviceStagedComm world(host, dev.comm());
      rc::GpuTrainOptions opt;
      opt.gemm = gemm;
      rc::GpuTrainer t(dev, m, l, opt, &world, rt::Recorder::Clock::now());
      std::vector<double> mine;
      for (int i = 0; i < 5; ++i) mine.push_back(t.step().loss);
      Biases b;
      for (const rc::GpuParam& p : t.params().params())
        if (!p.spec.trainable) b[p.spec.name] = t.params().download_values(p.spec.name);
      std::lock_guard<std::mutex> lk(mu);
      out.bias[std::size_t(host.rank())] = b;
      if (host.rank() == 0) out.losses = mine;
    });
    return out;
  };
  const auto fp32 = kernels::cuda::GemmType::fp32, bf16 = kernels::cuda::GemmType::bf16_fp32;
  for (const Layout& l : {batch(experts(1, layout(1, 1, 1))), batch(experts(4, layout(2, 1, 2, "1f1b", true))),
                          batch(zero1(experts(2, layout(1, 1, 4))))}) {
    CAPTURE(l.describe());
    const Run r = run(l, fp32);
    int moved = 0;
    for (const Biases& per_rank : r.bias) {
      REQUIRE(per_rank.size() == want.size());  // layers 1-3 (layer 0 is dense)
      for (const auto& item : want.items()) {
        const std::string name = item.key();
        CAPTURE(name);
        REQUIRE(per_rank.count(name));
        const std::vector<float>& got = per_rank.at(name);
        REQUIRE(got.size() == item.value().size());
        for (std::size_t e = 0; e < got.size(); ++e) {
          CHECK(got[e] == doctest::Approx(item.value()[e].get<double>()).epsilon(1e-6));
          moved += item.value()[e].get<double>() != 0.0;
        }
      }
    }
    CHECK(moved > 20);
    const auto cpu = rt::train_threads(m, l, {}, 5);
    for (int i = 0; i < 5; ++i)
      CHECK(std::abs(r.losses[std::size_t(i)] - cpu.steps[std::size_t(i)].loss) <= kLossTolFp32 * cpu.steps[std::size_t(i)].loss);
  }
  const Run plain = run(batch(experts(2, layout(1, 1, 4))), bf16), sharded = run(batch(zero1(experts(2, layout(1, 1, 4)))), bf16);
  int moved = 0;
  for (const auto& [name, values] : plain.bias[0])
    for (float v : values) moved += v != 0.0f;
  CHECK(moved > 20);
  for (std::size_t r = 0; r < sharded.bias.size(); ++r) {
    CAPTURE(r);
    CHECK(sharded.bias[r] == plain.bias[0]);
  }
  for (int i = 0; i < 5; ++i)
    CHECK(std::abs(sharded.losses[std::size_t(i)] - plain.losses[std::size_t(i)]) <= kLossTolFp32 * plain.losses[std::size_t(i)]);
}

// A MoE run's checkpoint: the routed experts written from their own store by each edp rank 0 (under ZeRO-1
// their moments gathered over edp first), read back by name, so a GPU run at ep 2 with ZeRO-1 resumes on the
// CPU runtime at ep 4 (experts regrouped), and a CPU run at ep 4 with ZeRO-1 resumes on the GPU at ep 2
// across pipeline stages, each as the uninterrupted CPU run goes on.
TEST_CASE("a mixture of experts' recovery checkpoint crosses between the GPU and CPU runtimes and ep sizes") {
  const Model m = load_model("tiny-moe");
  const Layout g = zero1(experts(2, layout(1, 1, 4))), c = experts(4, layout(2, 1, 2, "1f1b", true));
  const auto whole = rt::train_threads(m, g, {}, 4);
  const auto near = [&](double got, double want, double tol) { return std::abs(got - want) <= tol * std::abs(want); };
  {
    TempDir dir("tessel-gpu-moe-ckpt-a");
    (void)gpu_threads(m, g, 2, "", dir.p.string());
    const std::vector<rt::StepStats> tail = cpu_resumed(m, c, dir.p.string(), 4);
    REQUIRE(tail.size() == 2);
    for (int i = 0; i < 2; ++i) {
      CAPTURE(i + 2);
      CHECK(near(tail[std::size_t(i)].loss, whole.steps[std::size_t(i) + 2].loss, kLossTolFp32));
      CHECK(near(tail[std::size_t(i)].aux_loss, whole.steps[std::size_t(i) + 2].aux_loss, kLossTolFp32));
      CHECK(near(tail[std::size_t(i)].grad_norm, whole.steps[std::size_t(i) + 2].grad_norm, kNormTolFp32));
    }
  }
  {
    TempDir dir("tessel-gpu-moe-ckpt-b");
    Layout cz = zero1(c);
    rt::run_threads(cz.gpus(), [&](rt::Comm& world) {
      rt::Trainer t(m, cz, {}, world, rt::Recorder::Clock::now());
      while (t.steps_done() < 2) (void)t.step();
      rt::save_checkpoint(t, dir.p.string(), 1234);
    });
    const GpuRun r = gpu_threads(m, experts(2, layout(1, 2, 2)), 4, dir.p.string());
    REQUIRE(r.steps.size() == 2);
    for (int i = 0; i < 2; ++i) {
      CAPTURE(i + 2);
      CHECK(near(r.steps[std::size_t(i)].loss, whole.steps[std::size_t(i) + 2].loss, kLossTolFp32));
      CHECK(near(r.steps[std::size_t(i)].grad_norm, whole.steps[std::size_t(i) + 2].grad_norm, kNormTolFp32));
    }
  }
}

TEST_CASE("bf16 ZeRO-1/2 checkpoints round-trip the sharded fp32 values") {
  const Model m = load_model("tiny");
  const auto bf16 = kernels::cuda::GemmType::bf16_fp32;
  const Layout z1 = zero1(layout(1, 2, 2)), z2 = zero(2, layout(1, 2, 2));
  const GpuRun whole = gpu_threads(m, z1, 4, "", "", bf16);
  TempDir dir("tessel-gpu-ckpt-bf16");
  (void)gpu_threads(m, z1, 2, "", dir.p.string(), bf16);
  for (const Layout& g : {z1, z2}) {
    const std::string where = g.describe();
    CAPTURE(where);
    const GpuRun tail = gpu_threads(m, g, 4, dir.p.string(), "", bf16);
    REQUIRE(tail.steps.size() == 2);
    for (int i = 0; i < 2; ++i) {
      CAPTURE(i + 2);
      const rt::StepStats& want = whole.steps[std::size_t(i) + 2];
      CHECK(std::abs(tail.steps[std::size_t(i)].loss - want.loss) <= kLossTolFp32 * want.loss);
      CHECK(std::abs(tail.steps[std::size_t(i)].grad_norm - want.grad_norm) <= kNormTolFp32 * want.grad_norm);
    }
  }
}

#ifdef TESSEL_FAKE_NCCL
// The same layouts through NcclComm on the fake NCCL (tests/cuda_fake/fake_nccl.cpp), whose sends wait for
// their receives and whose collectives wait for every rank, as on GPUs: the staged transport above buffers
// messages, so it cannot show that a schedule's point-to-point order, interleaved with the tp, dp and
// embedding collectives on the one communication stream, never makes two ranks wait for each other. Also
// checks NcclComm's calls (in-place all-gather, reduce-scatter counts, split ordering) against NCCL's
// documented contracts as the fake implements them.
TEST_CASE("the multi-rank layouts run over NCCL's blocking semantics without deadlock and match the CPU runtime") {
  const Model tiny = load_model("tiny");
  const auto fp32 = kernels::cuda::GemmType::fp32;
  compare(tiny, layout(2, 2, 2, "1f1b", true), fp32, true);
  compare(tiny, layout(1, 4, 1, "1f1b"), fp32, true);
  compare(tiny, p2p_overlap(layout(1, 4, 1, "1f1b")), fp32, true);
  compare(tiny, layout(1, 4, 1, "gpipe"), fp32, true);
  compare(tiny, p2p_overlap(layout(1, 2, 2, "interleaved", false, 2)), fp32, true);
  compare(tiny, layout(1, 4, 1, "zb1p"), fp32, true);
  compare(tiny_llama(), layout(1, 2, 1, "zbv", false, 2), fp32, true);
  compare(tiny, p2p_overlap(layout(2, 2, 1, "dualpipev", true, 2)), fp32, true);
  compare(tiny, zero1(layout(2, 2, 2, "1f1b", true)), fp32, true);
  compare(tiny, no_overlap(zero1(layout(1, 2, 2, "1f1b"))), fp32, true);
  compare(tiny, zero1(layout(2, 2, 2, "dualpipev", true, 2)), fp32, true);
  compare(tiny, zero(2, layout(2, 2, 2, "1f1b", true)), fp32, true);
  compare(tiny, zero(3, layout(1, 2, 2, "zb1p")), fp32, true);
  compare(tiny, no_overlap(zero(3, layout(1, 2, 2, "1f1b"))), fp32, true);
  // A mixture of experts: the all-to-alls as NCCL groups of sends and receives, which blocking pairs are not.
  const Model moe = load_model("tiny-moe");
  compare(moe, experts(4, layout(2, 1, 2, "1f1b", true)), fp32, true);
  compare(moe, experts(2, layout(1, 2, 2, "interleaved", false, 2)), fp32, true);
  compare(moe, experts(2, layout(2, 1, 2, "1f1b", true), 2), fp32, true);
  compare(moe, zero1(experts(2, layout(1, 1, 4))), fp32, true);
}

// A sharded checkpoint written through NcclComm (its barrier only waits for its own stream) resumes on the
// CPU runtime under another layout and continues the uninterrupted run.
TEST_CASE("a ZeRO-3 checkpoint saved over NCCL resumes on the CPU runtime") {
  const Model m = load_model("tiny");
  const Layout z3 = zero(3, layout(2, 2, 2, "1f1b", true)), b = layout(1, 2, 2);
  const auto whole = rt::train_threads(m, b, {}, 4);
  TempDir dir("tessel-gpu-ckpt-nccl");
  (void)gpu_threads(m, z3, 2, "", dir.p.string(), kernels::cuda::GemmType::fp32, true);
  const std::vector<rt::StepStats> tail = cpu_resumed(m, b, dir.p.string(), 4);
  REQUIRE(tail.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i + 2);
    CHECK(std::abs(tail[std::size_t(i)].loss - whole.steps[std::size_t(i) + 2].loss) <= kLossTolFp32 * whole.steps[std::size_t(i) + 2].loss);
    CHECK(std::abs(tail[std::size_t(i)].grad_norm - whole.steps[std::size_t(i) + 2].grad_norm) <=
          kNormTolFp32 * whole.steps[std::size_t(i) + 2].grad_norm);
  }
}
#endif

#ifdef TESSEL_FAKE_NCCL
// The layout's switches reach the runtime: with --no-overlap every data-parallel reduction and ZeRO-3
// gather is fenced where it is issued, and without overlap_p2p so are the pipeline sends, so no compute
// is issued while communication is in flight (the fake CUDA's count; the same layouts with the switches
// on count hundreds, the memory test below).
TEST_CASE("--no-overlap and no overlap_p2p leave nothing in flight beside compute") {
  const Model m = load_model("tiny");
  for (const Layout& l : {no_overlap(zero1(layout(1, 2, 2))), no_overlap(zero(3, layout(1, 2, 2))), no_overlap(layout(1, 2, 2))}) {
    CAPTURE(l.describe());
    std::mutex mu;
    std::vector<std::size_t> counts;
    rt::run_threads(l.gpus(), [&](rt::Comm& host) {
      rc::CudaDevice dev(0);
      rc::DeviceStagedComm world(host, dev.comm());
      rc::GpuTrainer t(dev, m, l, {}, &world, rt::Recorder::Clock::now());
      (void)t.step();
      std::lock_guard<std::mutex> lk(mu);
      counts.push_back(fake_overlapped_ops());
    });
    for (std::size_t c : counts) CHECK(c == 0);
  }
}

// What the bf16 GEMMs and bf16 bias epilogues read is the fp32 values rounded, for every parameter on every
// rank after the steps: the copy AdamW writes (ZeRO-0), or each rank's chunk written by AdamW and
// all-gathered in bf16 with the vectors broadcast in fp32 (ZeRO-1/2), exchanged before the next forward
// (overlap_param_gather) or at the step's end; and the fp32 values the kernels read (the vectors' store
// under sharded values) equal the master values. host_states() runs an exchange still waiting.
TEST_CASE("bf16 copies equal the rounded fp32 values after the step, ZeRO-0/1/2, exchange overlapped or not") {
  const Model m = load_model("tiny");
  for (const int z : {0, 1, 2})
    for (const bool overlap : {true, false}) {
      Layout l = zero(z, layout(1, 2, 2));
      l.overlap_param_gather = overlap;
      CAPTURE(l.describe());
      CAPTURE(overlap);
      std::mutex mu;
      std::size_t compared = 0, wrong = 0;
      std::vector<std::pair<int, std::size_t>> exposures;  // per rank: pp coordinate, exchanges exposed
      rt::run_threads(l.gpus(), [&](rt::Comm& host) {
        rc::CudaDevice dev(0);
        rc::DeviceStagedComm world(host, dev.comm());
        rc::GpuTrainOptions opt;
        opt.gemm = kernels::cuda::GemmType::bf16_fp32;
        rc::GpuTrainer t(dev, m, l, opt, &world, rt::Recorder::Clock::now());
        (void)t.step();
        (void)t.step();
        // Exchanges waited for without a prefetch, by step 2: the windows that open a stage (the first
        // stage's embeddings, both in one window; the last stage's first layer); the head's are prefetched.
        const std::size_t exposed = t.values_exchanges_exposed();
        const auto host_values = t.host_states();
        std::size_t n = 0, bad = 0;
        for (std::size_t i = 0; i < t.params().params().size(); ++i) {
          const rc::GpuParam& p = t.params().params()[i];
          const auto bits = t.params().download_half(p.spec.name);
          for (std::size_t j = 0; j < bits.size(); ++j) {
            const __nv_bfloat16 want = __float2bfloat16(host_values[i].data[j]);
            std::uint16_t w = 0;
            std::memcpy(&w, &want, sizeof(w));
            bad += bits[j] != w;
            ++n;
          }
          if (t.params().sharded_values() && !t.params().reads_fp32(p.spec)) continue;
          const auto values = t.params().download_values(p.spec.name);  // what the fp32 kernels read
          for (std::size_t j = 0; j < values.size(); ++j) bad += !(values[j] == host_values[i].data[j]), ++n;
        }
        const rt::RankCoords c = rt::coords_of(host.rank(), l);
        std::lock_guard<std::mutex> lk(mu);
        compared += n;
        wrong += bad;
        exposures.emplace_back(c.pp, exposed);
      });
      CHECK(compared > 0);
      CHECK(wrong == 0);
      for (const auto& e : exposures) {
        const int pp = e.first;
        CAPTURE(pp);
        CHECK(e.second == (z == 0 || !overlap ? 0u : pp == 0 ? 2u : 1u));
      }
    }
}

// ZeRO-1/2's values exchange after the optimizer step waits for the next step's forward under
// overlap_param_gather alone (the gradient reductions fenced): nothing overlaps in the first step, which
// has no exchange before it, and compute runs beside the exchanges in the second; each rank's first
// window waits for its first group and the prefetch keeps one group ahead. fp32 and bf16 GEMMs (the
// exchange in fp32 in place, or in bf16 with the vectors broadcast).
TEST_CASE("ZeRO-1/2 values exchange overlaps the next forward under overlap_param_gather") {
  const Model m = load_model("tiny");
  for (const int z : {1, 2})
    for (const auto gemm : {kernels::cuda::GemmType::fp32, kernels::cuda::GemmType::bf16_fp32}) {
      Layout l = zero(z, layout(1, 2, 2));
      l.overlap_grad_reduce = false;
      l.overlap_param_gather = true;
      CAPTURE(l.describe());
      CAPTURE(int(gemm));
      std::mutex mu;
      std::vector<std::pair<std::size_t, std::size_t>> counts;  // after step 1, after step 2
      rt::run_threads(l.gpus(), [&](rt::Comm& host) {
        rc::CudaDevice dev(0);
        rc::DeviceStagedComm world(host, dev.comm());
        rc::GpuTrainOptions opt;
        opt.gemm = gemm;
        rc::GpuTrainer t(dev, m, l, opt, &world, rt::Recorder::Clock::now());
        (void)t.step();
        const std::size_t first = fake_overlapped_ops();
        (void)t.step();
        std::lock_guard<std::mutex> lk(mu);
        counts.emplace_back(first, fake_overlapped_ops() - first);
      });
      for (const auto& c : counts) {
        CHECK(c.first == 0);
        CHECK(c.second > 0);
      }
    }
}
#endif

// What each ZeRO stage keeps between steps, to the byte: after a step, the device memory in use on dp rank
// 0 is what it was before the step, and ZeRO 0's less exactly the buffers the stage shards (in the
// allocator's block sizes), so no group gradient and no gathered group outlives its window. ZeRO-1:
// moments and the fp32 values of a shard (under bf16 GEMMs only the bf16 copy and the fp32 vectors and
// embeddings stay whole), plus the reduced-gradient shard; ZeRO-2: no whole gradient; ZeRO-3: no whole
// values nor bf16 copy. The step's peak falls with them, and ZeRO-2's is ZeRO-1's less its whole gradient
// but for a couple of group gradients. Saving a sharded checkpoint adds no more than three buffers of its
// largest group.
TEST_CASE("ZeRO stages on the GPU hold exactly the sharded state between steps, and their peaks fall") {
  const Model m = load_model("tiny");
  const auto blk = [](std::size_t elems, std::size_t bytes) { return rc::CachingAllocator::round(elems * bytes); };
  struct Mem {
    std::size_t in_use = 0, peak = 0, state = 0, group = 0;  // group: the largest group's gradient block
  };
  std::vector<Mem> mem;
  std::vector<std::size_t> overlapped;  // rank 0's, per stage (fake CUDA)
  for (int z = 0; z <= 3; ++z) {
    const Layout l = zero(z, layout(1, 1, 2));
    const TempDir dir("tessel-gpu-zero-mem");
    Mem got;
    std::mutex mu;
    rt::run_threads(l.gpus(), [&](rt::Comm& host) {
      rc::CudaDevice dev(0);
      rc::DeviceStagedComm world(host, dev.comm());
      rc::GpuTrainer t(dev, m, l, {}, &world, rt::Recorder::Clock::now());
      const std::size_t built = dev.memory().in_use();
      (void)t.step();
      CHECK(dev.memory().in_use() == built);  // nothing of a step outlives it
      (void)t.step();
      CHECK(dev.memory().in_use() == built);
      const std::size_t step_peak = dev.memory().peak();
      if (z >= 2) {  // a sharded checkpoint passes group by group: three buffers of the largest group at most
        dev.memory().reset_peak();
        t.save_checkpoint(dir.p.string(), 1234);
        std::size_t span = 0;
        for (const rc::GpuZeroGroup& g : t.params().groups()) span = std::max(span, g.chunk * std::size_t(l.dp));
        CHECK(dev.memory().peak() - built <= 3 * blk(span, 4));
        CHECK(dev.memory().in_use() == built);
      }
      if (host.rank() != 0) return;
      const rc::GpuParams& p = t.params();
      const std::size_t n = p.padded(), k = p.shard_size();
      // One layer's gradient at a time, and the one before it while its reduce-scatter is in flight
      // beside the layer's backward (the head's pair and a layer: three), not a stage's.
      if (z >= 2) CHECK(p.max_live_group_grads() == 3);
#ifdef TESSEL_FAKE_NCCL  // (the fake CUDA's builds of this file)
      // Compute issued while a reduction or gather is in flight (the fake's count): ZeRO-0/1 reduce each
      // layer's bucket beside the rest of the step's last backward (two steps: at least one operation per
      // layer each), ZeRO-2 each group beside the next group's backward in every micro-batch, ZeRO-3 also
      // gathers each layer beside the one before it.
      overlapped.push_back(fake_overlapped_ops());
      if (z < 2) CHECK(overlapped.back() >= std::size_t(2 * m.layers));
      if (z == 2) CHECK(overlapped.back() > overlapped[1]);
      if (z == 3) CHECK(overlapped.back() > overlapped[2] + std::size_t(2 * 2 * m.layers));
#endif
      Mem r{dev.memory().in_use(), step_peak, 0, 0};
      for (const rc::GpuZeroGroup& g : p.groups()) r.group = std::max(r.group, blk(g.chunk * std::size_t(l.dp), 4));
      // Buffers of the state, as GpuParams allocates them for this stage (bf16 GEMMs).
      if (z == 0) r.state += blk(n, 4) + blk(n, 2);  // values and their bf16 copy
      else if (z < 3)                                 // the values' shard, the bf16 copy, the fp32-read ones
        r.state += blk(k, 4) + blk(n, 2) + blk(p.small_size(), 4);
      else r.state += blk(k, 4);                      // the values' shard
      if (z < 2) r.state += blk(n, 4);              // the whole gradient
      r.state += 2 * blk(z >= 1 ? k : n, 4);        // moments
      if (z >= 1) r.state += blk(k, 4);             // the reduced gradient's shard
      std::lock_guard<std::mutex> lk(mu);
      got = r;
    });
    mem.push_back(got);
  }
  for (int z = 1; z <= 3; ++z) {
    CAPTURE(z);
    CHECK(mem[z].state < mem[z - 1].state);
    // Everything else (tokens, rotary tables, the loss) is the same whatever the stage.
    CHECK(mem[z].in_use - mem[z].state == mem[0].in_use - mem[0].state);
    CHECK(mem[z].peak < mem[z - 1].peak);
  }
  // ZeRO-2 drops ZeRO-1's whole gradient from the peak too, not only between steps: its group gradients
  // are made as the backward reaches them and live one layer's backward at a time, plus one in reduction
  // (checked above), so at most three are live at its peak. Made all at once for an action, a stage's
  // (pp 1: all) would be.
  CHECK(mem[1].peak - mem[2].peak + 3 * mem[2].group >= mem[1].state - mem[2].state);
}

}  // TEST_SUITE
