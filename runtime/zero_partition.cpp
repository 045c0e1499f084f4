#include "runtime/zero_partition.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::rt {

std::string zero_group_of(const std::string& name) {
  if (name.rfind("layers.", 0) == 0) return name.substr(0, name.find('.', 7));  // "layers.<i>"
  if (name.rfind("final_ln.", 0) == 0 || name.rfind("head.", 0) == 0) return "final";
  return name;  // embed.tok, embed.pos
}

ZeroPartition::ZeroPartition(const ParamStore& store, int dp, int dp_rank) : dp_(dp), rank_(dp_rank) {
  TESSEL_CHECK(dp >= 1 && dp_rank >= 0 && dp_rank < dp, "ZeRO partition of dp rank " << dp_rank << " of " << dp);
  for (const Param& p : store.params()) {
    if (p.spec.name == "head.w") tied_ = false;
    const std::string g = zero_group_of(p.spec.name);
    if (groups_.empty() || groups_.back().name != g) {
      TESSEL_CHECK(groups_.empty() || groups_.back().end == p.offset, "parameter " << p.spec.name << " is not contiguous with its group");
      groups_.push_back({g, p.offset, p.offset, 0, 0});
    }
    TESSEL_CHECK(groups_.back().end == p.offset, "parameter group " << g << " is not contiguous in the flat buffer");
    groups_.back().end = p.offset + p.size();
  }
  for (ZeroGroup& g : groups_) {
    const std::size_t n = g.end - g.begin, d = static_cast<std::size_t>(dp);
    g.chunk = (n + d - 1) / d;
    g.local = shard_size_;
    shard_size_ += g.chunk;
  }
}

std::size_t ZeroPartition::owned_begin(const ZeroGroup& g, int d) const {
  return std::min(g.end, g.begin + static_cast<std::size_t>(d) * g.chunk);
}

std::size_t ZeroPartition::owned_end(const ZeroGroup& g, int d) const {
  return std::min(g.end, g.begin + static_cast<std::size_t>(d + 1) * g.chunk);
}

std::vector<std::string> zero_stage_group_names(int l0, int l1, bool first, bool last, bool tied) {
  std::vector<std::string> want;
  if (first) want = {"embed.tok", "embed.pos"};
  for (int i = l0; i < l1; ++i) want.push_back("layers." + std::to_string(i));
  if (last) {
    want.push_back("final");
    // The tied LM head. Untied, the last stage never touches embed.tok, even where its rank holds the
    // first stage too (V-shaped placements).
    if (tied) want.push_back("embed.tok");
  }
  return want;
}

std::vector<std::size_t> ZeroPartition::stage_groups(int l0, int l1, bool first, bool last) const {
  const std::vector<std::string> want = zero_stage_group_names(l0, l1, first, last, tied_);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < groups_.size(); ++i)
    if (std::find(want.begin(), want.end(), groups_[i].name) != want.end()) out.push_back(i);
  return out;
}

std::vector<float> ZeroPartition::unshard(const std::vector<float>& gathered, std::size_t n) const {
  TESSEL_CHECK(gathered.size() == shard_size_ * static_cast<std::size_t>(dp_), "unshard: " << gathered.size()
               << " gathered elements, expected " << shard_size_ * static_cast<std::size_t>(dp_));
  std::vector<float> full(n, 0.0f);
  for (const ZeroGroup& g : groups_)
    for (int d = 0; d < dp_; ++d) {
      const std::size_t a = owned_begin(g, d), b = owned_end(g, d);
      const float* src = gathered.data() + static_cast<std::size_t>(d) * shard_size_ + g.local;
      std::copy(src, src + (b - a), full.begin() + static_cast<long>(a));
    }
  return full;
}

}  // namespace tessel::rt
