// `tessel bench --backend cuda`: the CPU bench's rows (tools/cmd_bench.cpp) measured on the GPU.
//   gemm         cuBLASLt through kernels/cuda/gemm.hpp, the calibration sweep's shapes (the GPT layer GEMMs
//                of bench/h200/NOTES.md's fit and square ones); precision bf16: bf16 operands and output, fp32
//                accumulation; fp32: TF32 (the tensor-core rate the cost model's fp32 GPU path uses)
//   membw        device-to-device copies past the L2 (bytes = read + written)
//   kernels      attention_fwd / attention_bwd rows on the cost model's attention path, timed with the
//                variant --attention-kernel names (the default: tc), FLOPs and bytes as tools/cmd_bench.cpp
//                charges them (causal: half the s x s products; bwd 2.5x the forward)
//   collectives  NCCL across every visible GPU (one thread each), nccl-tests' S and bus factors
// Timing: CUDA events around each call after warm-up calls, the median of the repetitions.
#include "tools/bench_cuda.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/kernels.hpp"
#include "runtime/comm/comm_bench.hpp"
#include "runtime/cuda/device.hpp"
#include "runtime/cuda/nccl_comm.hpp"
#include "util/error.hpp"

namespace tessel::cmd {

namespace {

namespace kg = kernels::cuda;
using rt::cuda::cuda_ok;
using kg::throw_if_failed;

constexpr int kWarmup = 3, kReps = 10;

// Seconds of one call of f on `s`: the median of kReps event-timed calls after kWarmup untimed ones.
double median_s(cudaStream_t s, const std::function<void()>& f) {
  for (int i = 0; i < kWarmup; ++i) f();
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "bench: event");
  cuda_ok(cudaEventCreate(&b), "bench: event");
  std::vector<float> ms;
  for (int i = 0; i < kReps; ++i) {
    cuda_ok(cudaEventRecord(a, s), "bench: event");
    f();
    cuda_ok(cudaEventRecord(b, s), "bench: event");
    cuda_ok(cudaEventSynchronize(b), "bench: event");
    float t = 0;
    cuda_ok(cudaEventElapsedTime(&t, a, b), "bench: event");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2] * 1e-3;
}

// Uniform values in [-1, 1) (never zeros) in a device buffer of n fp32, or of n bf16 rounded from them.
rt::cuda::DBuf filled(rt::cuda::CudaDevice& dev, std::size_t n, std::uint64_t seed, bool bf16) {
  rt::cuda::DBuf f = dev.alloc_f32(n);
  throw_if_failed(kg::fill_uniform(dev.compute(), rt::cuda::f32(f), n, seed, 1.0f));
  if (!bf16) return f;
  rt::cuda::DBuf h = dev.alloc(n * 2);
  throw_if_failed(kg::to_bf16(dev.compute(), rt::cuda::f32(f), static_cast<__nv_bfloat16*>(h->get()), n));
  return h;
}

void bench_gemm(rt::cuda::CudaDevice& dev, calib::BenchData& out, const CudaBenchOptions& o) {
  // M x N x K: bench/h200/NOTES.md's sweep (square, and the GPT-3/1.3B layer and head GEMMs).
  std::vector<calib::GemmRow> shapes = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 8192, 8192},
                                        {8192, 2048, 8192}, {8192, 8192, 2048}, {16384, 6144, 2048}, {16384, 2048, 8192},
                                        {2048, 50304, 2048}, {4096, 12288, 1536}};
  if (o.quick) shapes = {{256, 256, 256}, {512, 256, 128}, {384, 512, 256}};
  const bool bf16 = o.precision == "bf16";
  for (calib::GemmRow r : shapes) {
    const std::size_t M = r.m, N = r.n, K = r.k;
    rt::cuda::DBuf A = filled(dev, M * K, 1, bf16), B = filled(dev, K * N, 2, bf16), C = dev.alloc(M * N * (bf16 ? 2 : 4));
    const kg::GemmArgs g{false, false, int(M), int(N), int(K), 1.0f, A->get(), int(K), B->get(), int(N), 0.0f, C->get(),
                         int(N), bf16 ? kg::GemmType::bf16 : kg::GemmType::tf32};
    r.time_s = median_s(dev.compute(), [&] { throw_if_failed(dev.gemm().run(dev.compute(), g)); });
    out.gemm.push_back(r);
  }
}

void bench_membw(rt::cuda::CudaDevice& dev, calib::BenchData& out, const CudaBenchOptions& o) {
  const std::vector<std::size_t> sizes = o.quick ? std::vector<std::size_t>{1 << 18, 1 << 20}
                                                 : std::vector<std::size_t>{1 << 24, 1 << 26, 1 << 28};  // fp32 elements
  for (std::size_t n : sizes) {
    rt::cuda::DBuf x = filled(dev, n, 3, false), y = dev.alloc_f32(n);
    const double t = median_s(dev.compute(), [&] {
      cuda_ok(cudaMemcpyAsync(y->get(), x->get(), n * 4, cudaMemcpyDeviceToDevice, dev.compute()), "bench: copy");
    });
    out.membw.push_back({"copy", 2.0 * 4.0 * double(n), t});
  }
}

void bench_attention(rt::cuda::CudaDevice& dev, calib::BenchData& out, const CudaBenchOptions& o) {
  // b x s = 16,384 tokens, 16 heads of 128 (bench/h200/NOTES.md's attention sweep); quick: one small shape.
  std::vector<kg::AttentionShape> shapes;
  for (int S : {1024, 2048, 4096}) shapes.push_back({16384 / S, S, 16, 16, 128});
  if (o.quick) shapes = {{2, 128, 2, 2, 64}};
  const bool bf16 = o.precision == "bf16";
  for (const kg::AttentionShape& a : shapes) {
    kg::Attention att(kg::resolve_attention_kernel(o.attention_kernel, bf16, a));
    const std::size_t T = std::size_t(a.batch) * a.seq, qd = std::size_t(a.hq) * a.d, rows = std::size_t(a.batch) * a.hq * a.seq;
    rt::cuda::DBuf q = filled(dev, T * qd, 4, false), k = filled(dev, T * qd, 5, false), v = filled(dev, T * qd, 6, false),
                   dO = filled(dev, T * qd, 7, false), O = dev.alloc_f32(T * qd), lse = dev.alloc_f32(rows),
                   delta = dev.alloc_f32(rows), dq = dev.alloc_f32(T * qd), dk = dev.alloc_f32(T * qd), dv = dev.alloc_f32(T * qd);
    kg::AttentionArgs g;
    g.shape = a;
    g.q = q->get(), g.k = k->get(), g.v = v->get(), g.dout = dO->get();
    g.ldq = g.ldk = g.ldv = g.lddo = g.ldo = g.lddq = g.lddk = g.lddv = int(qd);
    g.out = rt::cuda::f32(O), g.lse = rt::cuda::f32(lse), g.delta = rt::cuda::f32(delta);
    g.dq = rt::cuda::f32(dq), g.dk = rt::cuda::f32(dk), g.dv = rt::cuda::f32(dv);
    // tools/cmd_bench.cpp's charge: F = 4 b h s^2 d, the causal half forward, 2.5x that backward; io = the
    // four [tokens, h d] tensors (q, k, v, out) at the precision's element size, twice in the backward.
    const double full = 4.0 * a.batch * a.hq * double(a.seq) * a.seq * a.d, io = (bf16 ? 2.0 : 4.0) * double(T) * 4.0 * qd;
    const double tf = median_s(dev.compute(), [&] { throw_if_failed(att.forward(dev.compute(), g)); });
    out.kernels.push_back({"attention_fwd", "attention", io, full / 2, 1, tf});
    const double tb = median_s(dev.compute(), [&] { throw_if_failed(att.backward(dev.compute(), g)); });
    out.kernels.push_back({"attention_bwd", "attention", 2 * io, 2.5 * full / 2, 1, tb});
  }
}

const cost::Collective kCostColl[] = {cost::Collective::all_reduce, cost::Collective::all_gather,
                                      cost::Collective::reduce_scatter, cost::Collective::broadcast,
                                      cost::Collective::send_recv};

// One GPU's part of the NCCL sweep: rows (rank 0's) of every collective and size, time = this rank's mean
// over kReps calls after kWarmup, synchronised with the others by an all-reduce before each timing.
void nccl_rank(int rank, int world, const ncclUniqueId& id, const std::vector<std::size_t>& counts,
               std::vector<calib::CollRow>& rows) {
  cuda_ok(cudaSetDevice(rank), "bench: cudaSetDevice");
  rt::cuda::CudaDevice dev(rank);
  rt::cuda::NcclComm comm(rt::cuda::NcclBootstrap{rank, world, id, ""}, dev.comm());
  const std::size_t big = counts.back() * world;
  rt::cuda::DBuf a = filled(dev, big, 8, false), b = dev.alloc_f32(big);
  float* pa = rt::cuda::f32(a);
  float* pb = rt::cuda::f32(b);
  cuda_ok(cudaDeviceSynchronize(), "bench: fill");
  for (rt::Collective c : {rt::Collective::all_reduce, rt::Collective::all_gather, rt::Collective::reduce_scatter}) {
    for (std::size_t n : counts) {
      const auto once = [&] {
        if (c == rt::Collective::all_reduce) comm.all_reduce(pa, n);
        else if (c == rt::Collective::all_gather) comm.all_gather(pa, pb, n);
        else comm.reduce_scatter(pa, pb, n);
      };
      for (int i = 0; i < kWarmup; ++i) once();
      comm.all_reduce(pb, 1);
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kReps; ++i) once();
      comm.barrier();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kReps;
      const double S = 4.0 * double(n) * (c == rt::Collective::all_reduce ? 1 : world);  // nccl-tests' S
      if (rank == 0) rows.push_back({"nccl", kCostColl[int(c)], world, S, std::int64_t(n), t});
    }
  }
}

void bench_nccl(calib::BenchData& out, int gpus, const CudaBenchOptions& o) {
  const std::vector<std::size_t> counts = o.quick ? std::vector<std::size_t>{1024, 65536}
                                                  : std::vector<std::size_t>{1 << 12, 1 << 16, 1 << 20, 1 << 24};
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) throw kg::DeviceError("bench: ncclGetUniqueId failed");
  std::vector<calib::CollRow> rows;
  std::vector<std::thread> ranks;
  std::vector<std::string> errors(gpus);
  for (int r = 0; r < gpus; ++r)
    ranks.emplace_back([&, r] {
      try {
        nccl_rank(r, gpus, id, counts, rows);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) throw kg::DeviceError("bench: NCCL: " + e);
  out.collectives.insert(out.collectives.end(), rows.begin(), rows.end());
}

}  // namespace

void bench_cuda(calib::BenchData& out, const CudaBenchOptions& o) {
  const int gpus = kg::device_count();
  if (gpus == 0)
    throw InputError("--backend cuda: no CUDA device is visible to this process (no GPU or no driver); use --backend cpu");
  out.backend = "cuda";
  out.gemm_backend = "cublaslt";
  out.precision = o.precision;
  out.concurrent = 1;
  {
    rt::cuda::CudaDevice dev(0);
    if (o.gemm) bench_gemm(dev, out, o);
    if (o.membw) bench_membw(dev, out, o);
    if (o.kernels) bench_attention(dev, out, o);
    cuda_ok(cudaDeviceSynchronize(), "bench");
  }
  if (o.collectives && gpus > 1) bench_nccl(out, gpus, o);
}

}  // namespace tessel::cmd
