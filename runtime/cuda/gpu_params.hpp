// One rank's GPT parameters on the GPU: the same names, shards and order as runtime/params.hpp's
// ParamStore, in flat device buffers (fp32 master data and gradients, AdamW moments, and a bf16 shadow of
// the data that the mixed-precision GEMMs read, refreshed after every optimizer step).
//
// ZeRO (Rajbhandari et al. 2020) over zero_dp data-parallel ranks, as the CPU runtime's optimizer
// (runtime/optimizer_step.hpp) does it, so the two agree value for value. Every stage lays the flat
// buffers out by parameter group (runtime/zero_partition.hpp's groups: the token embedding, positions,
// each layer, the final norm + head), each group over zero_dp equal 64-element chunks, so one group's
// gather or reduce-scatter is a single even collective in place; this rank keeps AdamW moments and the
// reduced gradient (shard_grad()) for its chunks only.
//  - ZeRO-1 (Megatron's distributed optimizer): the trainer reduce-scatters the whole gradient group by
//    group after the flush, steps the chunks and all-gathers the values.
//  - ZeRO-2/3: no whole-model gradient buffer exists: a group's full gradient is allocated when the
//    stage's backward reaches it (begin_group_grad, through GpuStage's gradient window) and handed to the
//    trainer's reduce-scatter when the micro-batch's part of it is complete (take_group_grad), which
//    frees it.
//  - Sharded values (sharded_values()): ZeRO-3, and ZeRO-1/2 under bf16 GEMMs, keep only this rank's
//    chunks of the fp32 master values (shard_data()). ZeRO-1/2 then hold whole only the bf16 copy the
//    GEMMs read and the fp32 values of the vectors and embeddings (reads_fp32), rebuilt after each step
//    by a bf16 all-gather and a broadcast of the group's fp32 run (exchange_values_bf16), or from a
//    group-sized fp32 gather (gather_values); ZeRO-3's group values (and their bf16 copy) exist between
//    prepare_gather and release_group.
// Looking up a gradient, or a value that is not held, outside its window throws, naming the parameter.
// The update is elementwise, so the same as unsharded AdamW; only the gradient norm's summation order differs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/optimizer.hpp"
#include "runtime/cuda/device.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/params.hpp"

namespace tessel::rt::cuda {

struct GpuZeroGroup {
  std::string name;
  std::size_t begin = 0, end = 0;  // flat [begin, end): the group's parameters (alignment padding included)
  std::size_t chunk = 0;           // elements per dp rank; the group spans [begin, begin + chunk * zero_dp)
  std::size_t local = 0;           // where this rank's chunk starts in the shard vectors
  // The parameters kernels read in fp32 (reads_fp32) come first in a group: [begin, begin + fp32_span),
  // mirrored in the fp32 store of sharded values at small_begin.
  std::size_t fp32_span = 0, small_begin = 0;
};

struct GpuParam {
  ParamSpec spec;
  std::int64_t rows = 1, cols = 1, row0 = 0, col0 = 0;  // local shard, as ParamStore shards
  std::size_t offset = 0;
  std::size_t group = 0;  // index into GpuParams::groups() when sharded
  std::size_t small = 0;  // offset in the fp32 store of the parameters kernels read in fp32 (see below)
  std::size_t size() const { return static_cast<std::size_t>(rows * cols); }
};

class GpuParams {
 public:
  // zero_stage 0 (or zero_dp 1): unsharded; 1, 2, 3: ZeRO over zero_dp ranks, this one zero_rank.
  // bf16_gemms: the GEMMs read the weight matrices' bf16 copy only (GemmType::bf16_fp32), so ZeRO-1/2 can
  // shard the fp32 master values too (Megatron's distributed optimizer) and keep whole only the bf16
  // copy and the fp32 values of what the kernels read in fp32 (reads_fp32).
  // first_stage: this rank runs stage 0, whose embedding lookup reads the embeddings in fp32.
  GpuParams(CudaDevice& dev, const Model& m, const std::vector<std::string>& names, int tp, int tp_rank,
            int zero_dp = 1, int zero_rank = 0, int zero_stage = 0, bool bf16_gemms = false, bool first_stage = true);

  // The CPU runtime's seeded initialisation, copied up: the GPU starts from the CPU reference's weights.
  void upload(const ParamStore& host);
  // Synthesised weights (--only-rank): a hash-uniform fill of the right scale on the device.
  void synthesise(std::uint64_t seed);

  bool has(const std::string& n) const { return index_.count(n) > 0; }
  const GpuParam& at(const std::string& n) const;
  // fp32 values: ZeRO-3 only while the group is gathered; ZeRO-1/2 with sharded values only for reads_fp32.
  float* data(const std::string& n);
  float* grad(const std::string& n);  // ZeRO-2/3: only while its group's gradient is live
  const __nv_bfloat16* half(const std::string& n) const;
  const std::vector<GpuParam>& params() const { return params_; }
  std::size_t count() const { return total_; }     // elements of the flat buffers in use (padding excluded)
  std::size_t padded() const { return padded_; }   // zero_dp * shard_size()
  float* flat_grad();  // unsharded and ZeRO-1 only
  float* flat_data();  // the whole fp32 values: not when sharded_values()
  bool sharded() const { return zero_dp_ > 1; }
  int zero_stage() const { return sharded() ? zero_stage_ : 0; }
  bool grouped() const { return zero_stage() >= 2; }  // per-group gradients (ZeRO-2/3)
  // The fp32 master values live in this rank's chunks only (shard_data()): ZeRO-3, and ZeRO-1/2 under
  // bf16 GEMMs. Their whole bf16 copy (and the reads_fp32 values) then come from each step's exchange.
  bool sharded_values() const { return zero_stage() == 3 || (sharded() && bf16_gemms_); }
  // Parameters kernels read in fp32 whatever the GEMM type: vectors (norms, biases), MoE routers, and on
  // the rank of the first stage the learned positions, and the token embedding under fp32 GEMMs (under
  // bf16 GEMMs the lookup reads its bf16 copy, as the tied head does).
  static bool is_router(const std::string& n) {
    static const std::string suffix = ".moe.router";
    return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  bool reads_fp32(const ParamSpec& s) const {
    if (s.rows == 1 || s.cols == 1) return true;
    if (is_router(s.name)) return true;  // a MoE router's GEMM runs in fp32 (GpuStage's mm_fp32)
    return first_stage_ && (s.name == "embed.pos" || (s.name == "embed.tok" && !bf16_gemms_));
  }
  std::size_t shard_size() const { return shard_; }
  std::size_t small_size() const { return small_size_; }  // elements of the reads_fp32 parameters (aligned)
  std::size_t shard_begin() const { return shard_ * std::size_t(zero_rank_); }
  float* shard_grad() { return f32(shard_grad_); }
  int zero_rank() const { return zero_rank_; }

  // ZeRO groups (every stage lays the flat buffers out by group), and those of the stage covering
  // layers [l0, l1) (the embeddings when first; the final group and a tied embedding when last).
  const std::vector<GpuZeroGroup>& groups() const { return groups_; }
  std::vector<std::size_t> stage_groups(int l0, int l1, bool first, bool last) const;
  std::size_t group_index(const std::string& name) const;  // groups().size() when this rank has no such group
  // The data-parallel reduction's buckets, one per group: the ZeRO groups when sharded; unsharded, the same
  // groups' spans of the flat gradient (begin, end; chunk = end - begin). stage_buckets / bucket_index as
  // stage_groups / group_index.
  const std::vector<GpuZeroGroup>& buckets() const { return sharded() ? groups_ : buckets_; }
  std::vector<std::size_t> stage_buckets(int l0, int l1, bool first, bool last) const;
  std::size_t bucket_index(const std::string& name) const;
  // ZeRO-2/3 gradients of group g: allocated and zeroed on stream s if not live (returns whether it was not),
  // and taken (the caller reduce-scatters the chunk * zero_dp elements, then lets the buffer go).
  bool begin_group_grad(std::size_t g, cudaStream_t s);
  bool group_grad_live(std::size_t g) const { return bool(group_grad_.at(g)); }
  // The group's buffer, counted live until group_grad_released() (its reduction may still be in flight).
  DBuf take_group_grad(std::size_t g);
  void group_grad_released() { --live_; }
  std::size_t max_live_group_grads() const { return max_live_; }  // the most live at once so far (open or reducing)
  // ZeRO-3 values of group g, in three calls. prepare_gather allocates the group's buffers and, when
  // values_in_bf16(g), writes this rank's chunk of the bf16 copy on s (the compute stream). gather queues
  // the exchange over dp on s (its stream; the caller orders it after prepare_gather): values_in_bf16, the
  // bf16 copy all-gathered in place and the group's fp32 run broadcast from rank 0 into a buffer of that
  // run alone (Megatron's and FSDP's 16-bit gather); otherwise the fp32 values whole. finish_gather, once
  // compute has waited for it, makes the bf16 copy of gathered fp32 values (nothing to do in bf16).
  // release_group drops the buffers.
  void prepare_gather(std::size_t g, cudaStream_t s);
  void gather(std::size_t g, Comm& dp, cudaStream_t s);
  void finish_gather(std::size_t g, cudaStream_t s);
  void release_group(std::size_t g);
  bool gathered(std::size_t g) const { return group_data_.at(g) || group_half_.at(g); }
  float* shard_data() { return f32(shard_data_); }
  // ZeRO-1/2 with sharded values, after the step: group g's whole fp32 values (gathered by the caller into
  // `values`, chunk * zero_dp elements) become its bf16 copy and its reads_fp32 values, on stream s.
  void gather_values(std::size_t g, const float* values, cudaStream_t s);
  // Under bf16 GEMMs with ZeRO: whether group g's values travel as Megatron's distributed optimizer and
  // FSDP move them, in bf16 (2 bytes a parameter), with only the group's fp32 run (its vectors) broadcast
  // from dp rank 0, which holds it whole. ZeRO-1/2: adamw writes each rank's chunk of the bf16 copy in
  // place, exchange_values_bf16 moves it; ZeRO-3: prepare_gather / gather. Otherwise (fp32 GEMMs, a group
  // all read in fp32 such as the learned positions, or a run longer than a chunk) the fp32 values are
  // gathered whole.
  bool values_in_bf16(std::size_t g) const {
    return sharded() && bf16_gemms_ && groups_.at(g).fp32_span <= groups_[g].chunk;
  }
  // values_in_bf16(g): queues group g's exchange on stream s, the stream of `dp` (the caller has ordered
  // it after the optimizer step): the in-place bf16 all-gather, then dp rank 0's fp32 run copied into the
  // store and broadcast.
  void exchange_values_bf16(std::size_t g, Comm& dp, cudaStream_t s);
  // The bytes of group g's values exchange as gather_params moves them (the trace's dp_allgather).
  double exchange_bytes(std::size_t g) const;
  // --only-rank: group g's whole values synthesised into `values` in place of the gather (synthesise()).
  void synthesise_values(std::size_t g, float* values, std::uint64_t seed, cudaStream_t s);
  // Host copy of one parameter's fp32 values as the kernels read them (the whole buffer, the fp32 store
  // of sharded values for reads_fp32 parameters, or ZeRO-3's gathered group).
  std::vector<float> download_values(const std::string& n);
  // One parameter's fp32 values set from the host in every copy this rank keeps of them: the whole fp32
  // values and their bf16 copy, or with sharded values this rank's runs of the master values, the bf16 copy
  // and the fp32 store (so ZeRO-1/2's exchange after a step carries them). Not under ZeRO-3. Synchronous.
  // A MoE router's selection bias, which no gradient trains, is moved this way after each step.
  void set_values(const std::string& n, const std::vector<float>& values, cudaStream_t s);
  // Gradient runs of the parameters `pick` accepts: each whole gradient (shard false, not under ZeRO-2/3), or
  // this rank's runs of them in shard_grad() (shard true, sharded only). Equal on tp peers and on the two
  // ranks of a tied embedding, whose groups have the same sizes.
  std::vector<std::pair<float*, std::size_t>> grad_runs(bool shard, const std::function<bool(const GpuParam&)>& pick);
  // --only-rank under ZeRO-3: the group's full values synthesised in place of a gather (see synthesise()).
  void synthesise_group(std::size_t g, std::uint64_t seed, cudaStream_t s);

  void zero_grad(cudaStream_t s);
  void refresh_half(cudaStream_t s);
  void refresh_half(cudaStream_t s, std::size_t g);  // group g's span (whole fp32 values only)
  // Clipping by `clip_coef` then AdamW (kernels/cpu/optimizer.hpp's contract), on every parameter (the bf16
  // copy written in the same pass) or, when sharded, on this rank's shard of the flat buffer (gradients
  // from shard_grad(); under bf16 GEMMs below ZeRO-3 with this rank's chunk of the bf16 copy too; the
  // caller exchanges the values afterwards: GpuTrainer::gather_params). The clip is
  // applied as the gradients are read: the gradient buffers keep the unclipped gradient.
  void adamw(cudaStream_t s, const kernels::cpu::AdamW& hp, int step, double clip_coef);
  // Device sum of squares of the gradients of the parameters `counted` accepts (the caller's rule: each
  // tensor counted once in the world); when sharded, of the parts inside this rank's shard.
  double local_grad_sq(cudaStream_t s, const std::function<bool(const GpuParam&)>& counted);
  // Host copy of one parameter's gradient (the numerics test); sharded, of the reduced gradient of this
  // rank's runs of it (download_shard_grad: empty when it owns none).
  std::vector<float> download_grad(const std::string& n);
  // Host copy of one parameter's bf16 copy, as bits (below ZeRO-3, or inside its group's gather).
  std::vector<std::uint16_t> download_half(const std::string& n) const;
  std::vector<float> download_shard_grad(const std::string& n);
  // Device bytes of the state this rank keeps between steps, by kind (ZeRO-sharded buffers at their shard
  // size): values (fp32, plus the bf16 copy the GEMMs read, not under ZeRO-3), gradients (the whole buffer
  // and/or the reduced shard), AdamW moments.
  struct StateBytes {
    std::size_t values = 0, grads = 0, moments = 0;
    std::size_t total() const { return values + grads + moments; }
  };
  StateBytes state_bytes() const;
  // The profile's work counts: bytes zero_grad() clears; parameter elements AdamW steps on this rank (this
  // rank's runs when sharded; alignment and chunk padding excluded).
  std::size_t zero_grad_bytes() const;
  std::size_t stepped_elements() const;

  // Recovery checkpoints: every parameter's value and AdamW moments (params() order) to and from the host,
  // synchronously. Sharded, group by group: saving all-gathers each group's chunks over `dp` (a collective:
  // every dp rank calls it), loading keeps this rank's chunks of each group.
  struct HostParamState {
    std::vector<float> data, exp_avg, exp_avg_sq;
  };
  void save_states(Comm* dp, std::vector<HostParamState>& out);
  void load_states(const std::vector<HostParamState>& in);

 private:
  CudaDevice& dev_;
  std::vector<GpuParam> params_;
  std::map<std::string, std::size_t> index_;
  std::size_t total_ = 0, padded_ = 0, shard_ = 0;
  int zero_dp_ = 1, zero_rank_ = 0, zero_stage_ = 0;
  bool bf16_gemms_ = false, first_stage_ = true;
  std::vector<GpuZeroGroup> groups_;
  std::vector<GpuZeroGroup> buckets_;  // unsharded only (buckets())
  std::vector<DBuf> group_grad_, group_data_, group_half_;  // ZeRO-2/3 per group, live or empty
  std::size_t live_ = 0, max_live_ = 0;                     // group gradients live now, and at most
  DBuf data_, grad_, m_, v_, half_, scratch_, shard_grad_;
  DBuf shard_data_;  // sharded_values(): this rank's chunks of the fp32 values
  DBuf small_;       // sharded_values() below ZeRO-3: the reads_fp32 parameters' fp32 values, whole
  std::size_t small_size_ = 0;
  // f(p, flat_begin, flat_end, shard_index) for every run of a parameter inside this rank's chunks.
  template <class F>
  void for_owned(F&& f) const;
  // sharded_values(): p's whole values at `values` -> its runs into the shard, and below ZeRO-3 its bf16
  // copy and (reads_fp32) its fp32 store.
  void keep_owned(const GpuParam& p, const float* values, cudaStream_t s);
  void synthesise_into(float* base, std::size_t begin, std::size_t end, std::uint64_t seed, cudaStream_t s);
  // values_in_bf16 group g's exchange on s over dp: `half` the group's bf16 copy (this rank's chunk in its
  // slot), `run` where its fp32 run goes (null when it has none).
  void exchange_bf16(const GpuZeroGroup& g, Comm& dp, cudaStream_t s, __nv_bfloat16* half, float* run);
};

}  // namespace tessel::rt::cuda
