// How ZeRO (Rajbhandari et al. 2020) splits one rank's flat parameter/gradient buffers over its data-parallel
// group: per parameter group, as PyTorch FSDP shards each wrapped unit's flat parameter and Megatron-LM's
// distributed optimizer shards each bucket, so that one pipeline stage's parameters can be gathered, and its
// gradients reduce-scattered, with even collectives and without touching the other stages.
//
// Groups (contiguous runs of ParamStore's flat buffer, which keeps gpt_param_specs() order):
//   "embed.tok"   the token embedding alone: the first and the last stage (tied LM head) shard it alike,
//                 so their gradient exchange works on shards;
//   "embed.pos"   learned positions;  "layers.i"  every parameter of layer i;  "final"  final norm + head.
// Group g of n elements is padded to dp * c (c = ceil(n / dp)); dp rank d owns [begin + d c, begin + (d+1) c)
// clipped to the group's end. A rank's shard vector is its chunks in group order (the padding included), so
// every dp rank's shard has the same length and one all-gather of shards rebuilds the full buffers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/params.hpp"

namespace tessel::rt {

struct ZeroGroup {
  std::string name;
  std::size_t begin = 0, end = 0;  // flat range [begin, end)
  std::size_t chunk = 0;           // ceil((end - begin) / dp)
  std::size_t local = 0;           // where this group's chunk starts in a shard vector
};

// The group a parameter name belongs to (see above).
std::string zero_group_of(const std::string& param_name);

// The names of the groups the stage covering layers [l0, l1) uses: the embeddings when first, its
// layers, the final group and (tied: no separate LM head) the token embedding when last.
std::vector<std::string> zero_stage_group_names(int l0, int l1, bool first, bool last, bool tied);

class ZeroPartition {
 public:
  ZeroPartition() = default;
  ZeroPartition(const ParamStore& store, int dp, int dp_rank);

  const std::vector<ZeroGroup>& groups() const { return groups_; }
  std::size_t shard_size() const { return shard_size_; }
  int dp() const { return dp_; }
  int dp_rank() const { return rank_; }

  // Flat range of group g that dp rank d owns (possibly empty at the end of the group).
  std::size_t owned_begin(const ZeroGroup& g, int d) const;
  std::size_t owned_end(const ZeroGroup& g, int d) const;

  // Indices into groups() of the groups a stage uses: its layers [l0, l1), the embeddings when first, the
  // final group and the tied embedding when last. Only groups this rank holds.
  std::vector<std::size_t> stage_groups(int l0, int l1, bool first, bool last) const;

  // Calls f(flat_begin, flat_end, local_begin) for every run this rank owns, in group order.
  template <class F>
  void for_owned(F&& f) const {
    for (const ZeroGroup& g : groups_) {
      const std::size_t a = owned_begin(g, rank_), b = owned_end(g, rank_);
      if (a < b) f(a, b, g.local);
    }
  }

  // The flat vector (n elements) from the all-gathered shards of every dp rank ([d * shard_size()...]).
  std::vector<float> unshard(const std::vector<float>& gathered, std::size_t n) const;

 private:
  std::vector<ZeroGroup> groups_;
  std::size_t shard_size_ = 0;
  int dp_ = 1, rank_ = 0;
  bool tied_ = true;  // no separate LM head among this rank's parameters
};

}  // namespace tessel::rt
