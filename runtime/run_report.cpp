#include "runtime/run_report.hpp"

#include <array>

#include "util/error.hpp"

namespace tessel::rt {

namespace {

// A Comm moves floats, whose 24-bit significand holds any 16-bit integer exactly: each 64-bit field
// travels as four 16-bit pieces. Absent fields travel as -1 (byte counts are never negative).
constexpr int kFields = 7, kPieces = 4;
using Packed = std::array<float, kFields * kPieces>;

Packed pack(const RankMemory& m) {
  const std::array<std::int64_t, kFields> v{m.parameter_bytes, m.gradient_bytes, m.optimizer_bytes,
                                            m.peak_activation_bytes.value_or(-1), m.peak_state_bytes.value_or(-1),
                                            m.device_peak_bytes.value_or(-1), m.device_reserved_bytes.value_or(-1)};
  Packed out{};
  for (int f = 0; f < kFields; ++f) {
    const auto bits = static_cast<std::uint64_t>(v[f]);
    for (int p = 0; p < kPieces; ++p) out[f * kPieces + p] = static_cast<float>((bits >> (16 * p)) & 0xffffu);
  }
  return out;
}

RankMemory unpack(const float* in, int rank) {
  std::array<std::int64_t, kFields> v{};
  for (int f = 0; f < kFields; ++f) {
    std::uint64_t bits = 0;
    for (int p = 0; p < kPieces; ++p) bits |= static_cast<std::uint64_t>(in[f * kPieces + p]) << (16 * p);
    v[f] = static_cast<std::int64_t>(bits);
  }
  const auto opt = [](std::int64_t x) { return x < 0 ? std::nullopt : std::optional<std::int64_t>(x); };
  RankMemory m;
  m.rank = rank;
  m.parameter_bytes = v[0];
  m.gradient_bytes = v[1];
  m.optimizer_bytes = v[2];
  m.peak_activation_bytes = opt(v[3]);
  m.peak_state_bytes = opt(v[4]);
  m.device_peak_bytes = opt(v[5]);
  m.device_reserved_bytes = opt(v[6]);
  return m;
}

}  // namespace

std::vector<RankMemory> gather_rank_memory(Comm& world, const RankMemory& mine) {
  TESSEL_CHECK(mine.rank == world.rank(), "rank memory of rank " << mine.rank << " gathered as rank " << world.rank());
  const Packed local = pack(mine);
  std::vector<float> all(local.size() * static_cast<std::size_t>(world.size()));
  world.all_gather(local.data(), all.data(), local.size());
  std::vector<RankMemory> out;
  for (int r = 0; r < world.size(); ++r) out.push_back(unpack(all.data() + local.size() * static_cast<std::size_t>(r), r));
  return out;
}

}  // namespace tessel::rt
