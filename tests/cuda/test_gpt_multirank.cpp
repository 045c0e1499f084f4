// Multi-rank layouts of the CUDA runtime on ONE GPU: every rank a thread with its own CudaDevice (streams,
// allocator, GEMM handle) on device 0, communicating through DeviceStagedComm over the thread backend. The
// GpuTrainer code that runs is the one NCCL runs under (tp collectives, vocab-parallel cross-entropy,
// sequence-parallel gradient sums, pipeline send/recv, the tied-embedding pair, the dp reduction); only the
// transport differs. Expected values: the CPU runtime on the same layout (train_threads), the reference
// every GPU test uses; fp32 GEMMs, so the differences are summation order only (the bounds of
// test_gpt_numerics.cpp). Recovery checkpoints cross runtimes and layouts both ways.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

#include "runtime/comm/thread_comm.hpp"
#include "runtime/cuda/gpu_trainer.hpp"
#include "runtime/cuda/staged_comm.hpp"
#include "runtime/trainer.hpp"
#include "runtime/trainer_checkpoint.hpp"

using namespace tessel;
namespace rc = tessel::rt::cuda;
namespace fs = std::filesystem;

namespace {

constexpr double kLossTol = 1e-4, kNormTol = 1e-3;  // fp32 GEMMs (test_gpt_numerics.cpp)

Layout layout(int tp, int pp, int dp, const char* schedule = "1f1b", bool sp = false, int vpp = 1) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.vpp = vpp;
  l.schedule = schedule;
  l.sequence_parallel = sp;
  l.micro_batch = 2;
  l.global_batch = 16;  // one data stream for every layout, so checkpoints resume across them
  l.precision = Precision::fp32;
  return l;
}

Layout zero1(Layout l) {
  l.zero_stage = 1;
  return l;
}

Model tiny_llama() {  // untied head, GQA (2 kv heads: one per tp rank at tp 2), RMSNorm, SwiGLU, rotary
  Model m = load_model("tiny");
  m.name = "tiny-llama";
  m.kv_heads = 2;
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position = PositionEmbedding::rotary;
  m.rope_theta = 100.0;
  m.tied_embeddings = false;
  m.bias = false;
  m.dropout = false;
  return m;
}

// Rank 0's per-step stats of the GPU runtime with every rank a thread on GPU 0; optionally resumes from /
// saves a recovery checkpoint.
std::vector<rt::StepStats> gpu_threads(const Model& m, const Layout& l, int steps, const std::string& resume = "",
                                       const std::string& save = "") {
  std::vector<rt::StepStats> out;
  std::mutex mu;
  rt::run_threads(l.gpus(), [&](rt::Comm& host) {
    rc::CudaDevice dev(0);
    rc::DeviceStagedComm world(host, dev.comm());
    rc::GpuTrainOptions opt;
    opt.gemm = kernels::cuda::GemmType::fp32;
    rc::GpuTrainer t(dev, m, l, opt, &world, rt::Recorder::Clock::now());
    if (!resume.empty()) t.load_checkpoint(resume, opt.seed);
    std::vector<rt::StepStats> mine;
    while (t.steps_done() < steps) mine.push_back(t.step());
    if (!save.empty()) t.save_checkpoint(save, opt.seed);
    std::lock_guard<std::mutex> lk(mu);
    if (host.rank() == 0) out = mine;
  });
  return out;
}

void compare(const Model& m, const Layout& l) {
  CAPTURE(m.name);
  const std::string where = l.describe();
  CAPTURE(where);
  const auto cpu = rt::train_threads(m, l, {}, 3);
  const auto gpu = gpu_threads(m, l, 3);
  REQUIRE(gpu.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(std::abs(gpu[i].loss - cpu.steps[i].loss) <= kLossTol * std::abs(cpu.steps[i].loss));
    CHECK(std::abs(gpu[i].grad_norm - cpu.steps[i].grad_norm) <= kNormTol * cpu.steps[i].grad_norm);
  }
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
}

// ZeRO-1 on the GPU: gradients reduce-scattered over dp, AdamW on each rank's shard of the flat buffer
// (shards cut through tensors), values all-gathered; against the CPU runtime's ZeRO-1.
TEST_CASE("ZeRO-1 on the GPU matches the CPU runtime") {
  compare(load_model("tiny"), zero1(layout(1, 1, 2)));
  compare(load_model("tiny"), zero1(layout(2, 2, 2, "1f1b", true)));
  compare(tiny_llama(), zero1(layout(1, 2, 2)));
}

// Saved on one runtime and layout, resumed on the other runtime under another layout: step 3 equals the
// uninterrupted CPU run's step 3 (same data position, weights and AdamW moments).
TEST_CASE("recovery checkpoints cross between the GPU and CPU runtimes and between layouts") {
  const Model m = load_model("tiny");
  const Layout a = layout(2, 2, 1, "1f1b", true), b = layout(1, 2, 2);
  const Layout c = zero1(layout(1, 2, 2));  // the GPU's sharded moments, gathered to save, sliced to load
  const auto whole = rt::train_threads(m, b, {}, 3);
  {
    TempDir dir("tessel-gpu-ckpt-a");
    (void)gpu_threads(m, a, 2, "", dir.p.string());  // GPU, tp2 pp2 -> CPU, pp2 dp2
    std::vector<double> resumed;
    int at = -1;
    std::mutex mu;
    rt::run_threads(b.gpus(), [&](rt::Comm& world) {
      rt::Trainer t(m, b, {}, world, rt::Recorder::Clock::now());
      rt::load_checkpoint(t, dir.p.string(), 1234);
      const int done = t.steps_done();
      const double loss = t.step().loss;
      std::lock_guard<std::mutex> lk(mu);
      if (world.rank() == 0) {
        resumed.push_back(loss);
        at = done;
      }
    });
    CHECK(at == 2);
    REQUIRE(resumed.size() == 1);
    CHECK(std::abs(resumed[0] - whole.steps[2].loss) <= kLossTol * whole.steps[2].loss);
  }
  {
    TempDir dir("tessel-gpu-ckpt-b");
    rt::run_threads(b.gpus(), [&](rt::Comm& world) {  // CPU, pp2 dp2 -> GPU, tp2 pp2
      rt::Trainer t(m, b, {}, world, rt::Recorder::Clock::now());
      for (int i = 0; i < 2; ++i) (void)t.step();
      rt::save_checkpoint(t, dir.p.string(), 1234);
    });
    for (const Layout& g : {a, c}) {
      const std::string where = g.describe();
      CAPTURE(where);
      const auto resumed = gpu_threads(m, g, 3, dir.p.string());
      REQUIRE(resumed.size() == 1);
      CHECK(resumed[0].step == 2);
      CHECK(std::abs(resumed[0].loss - whole.steps[2].loss) <= kLossTol * whole.steps[2].loss);
      CHECK(std::abs(resumed[0].grad_norm - whole.steps[2].grad_norm) <= kNormTol * whole.steps[2].grad_norm);
    }
  }
  {
    TempDir dir("tessel-gpu-ckpt-c");
    (void)gpu_threads(m, c, 2, "", dir.p.string());  // GPU ZeRO-1 -> GPU tp2 pp2
    const auto resumed = gpu_threads(m, a, 3, dir.p.string());
    REQUIRE(resumed.size() == 1);
    CHECK(std::abs(resumed[0].loss - whole.steps[2].loss) <= kLossTol * whole.steps[2].loss);
    CHECK(std::abs(resumed[0].grad_norm - whole.steps[2].grad_norm) <= kNormTol * whole.steps[2].grad_norm);
  }
}

}  // TEST_SUITE
