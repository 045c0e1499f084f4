// Resharding on load: a requested box of a logical tensor is assembled from every saved piece that
// intersects it, whatever layout saved them.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

namespace tessel::rt {
namespace {

std::string dims_text(const Shape& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Row-major linear index of `idx` inside a box of `extent`.
std::uint64_t linear(const Shape& idx, const Shape& extent) {
  std::uint64_t l = 0;
  for (std::size_t d = 0; d < extent.size(); ++d) l = l * extent[d] + idx[d];
  return l;
}

// Parameters and optimizer states are finite in any state a run can continue from: a NaN or infinity there
// trains "loss nan" from the first step on. The checksums cannot catch it (a run that diverged saved its
// values faithfully), so every value read is checked, and the first non-finite one is named with its
// tensor, its shard file and its index in the tensor's full shape.
void check_finite(const float* v, std::uint64_t n, const Shape& first, const std::string& name, const std::string& file) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) continue;
    Shape at = first;
    if (!at.empty()) at.back() += i;
    std::ostringstream os;
    os << file << ": tensor '" << name << "' element " << dims_text(at) << " is " << v[i]
       << "; parameters and optimizer states must be finite; the shard's checksum is valid, so it was "
          "saved so (a run that had diverged): resume an earlier step";
    throw InputError(os.str());
  }
}

}  // namespace

std::vector<float> CheckpointReader::read_slice(const std::string& name, const Shape& offset,
                                                const Shape& extent) const {
  const Tensor& t = tensor(name);
  const std::size_t nd = t.full.size();
  if (offset.size() != nd || extent.size() != nd)
    throw InputError("read_slice '" + name + "': offsets and extents need " + std::to_string(nd) + " dims");
  for (std::size_t d = 0; d < nd; ++d)
    if (offset[d] > t.full[d] || extent[d] > t.full[d] - offset[d])
      throw InputError("read_slice '" + name + "': region at " + dims_text(offset) + " of " + dims_text(extent) +
                       " leaves the tensor's shape " + dims_text(t.full));
  const std::uint64_t total = checked_elements(extent, "read_slice '" + name + "'");
  // Intersection [lo, hi) of the request with a saved piece, in global coordinates; false when empty.
  Shape lo(nd), hi(nd);
  const auto intersect = [&](const ShardEntry& e) {
    bool empty = false;
    for (std::size_t d = 0; d < nd; ++d) {
      lo[d] = std::max(offset[d], e.offset[d]);
      hi[d] = std::min(offset[d] + extent[d], e.offset[d] + e.extent[d]);
      empty = empty || lo[d] >= hi[d];
    }
    return !empty;
  };
  // The region's elements the saved pieces hold, counted before anything is allocated: a shard's header may
  // declare a full shape far beyond what its files carry (up to the 2^36-element limit), and a region no piece
  // can fill is refused here, so what is allocated is bounded by the bytes on disk.
  std::uint64_t held = 0;
  for (const Piece& p : t.pieces) {
    if (!intersect(*p.entry)) continue;
    std::uint64_t v = 1;
    for (std::size_t d = 0; d < nd; ++d) v *= hi[d] - lo[d];
    held += v;
  }
  if (held < total)
    throw InputError(folder_ + ": tensor '" + name + "': its shards hold " + std::to_string(held) + " of the " +
                     std::to_string(total) + " elements of the region at " + dims_text(offset) + " of " +
                     dims_text(extent) + " (the checkpoint covers only part of it)");
  std::vector<float> out(total);
  std::vector<unsigned char> covered(total, 0);
  if (total == 0) return out;

  for (const Piece& p : t.pieces) {
    const ShardEntry& e = *p.entry;
    if (!intersect(e)) continue;
    // Walk the intersection row by row (the last dim is contiguous in both the file and the output).
    const std::uint64_t run = nd ? hi[nd - 1] - lo[nd - 1] : 1;
    Shape g = lo;  // current global index; its last dim stays at lo
    Shape in_piece(nd), in_out(nd);
    for (;;) {
      for (std::size_t d = 0; d < nd; ++d) {
        in_piece[d] = g[d] - e.offset[d];
        in_out[d] = g[d] - offset[d];
      }
      std::uint64_t src = linear(in_piece, e.extent), dst = linear(in_out, extent);
      auto bytes = static_cast<ssize_t>(run * sizeof(float));
      if (::pread(fds_[p.file], out.data() + dst, run * sizeof(float),
                  static_cast<off_t>(e.data_pos + src * sizeof(float))) != bytes)
        throw InputError(files_[p.file] + ": cannot read tensor '" + name + "'");
      check_finite(out.data() + dst, run, g, name, files_[p.file]);
      std::fill(covered.begin() + dst, covered.begin() + dst + run, 1);
      // Next row: odometer over dims 0..nd-2.
      std::size_t d = nd >= 1 ? nd - 1 : 0;
      bool done = true;
      while (d-- > 0) {
        if (++g[d] < hi[d]) {
          done = false;
          break;
        }
        g[d] = lo[d];
      }
      if (done) break;
    }
  }
  auto gap = std::find(covered.begin(), covered.end(), 0);
  if (gap != covered.end()) {
    // Global index of the first element no shard holds, for the message.
    std::uint64_t l = static_cast<std::uint64_t>(gap - covered.begin());
    Shape idx(nd);
    for (std::size_t d = nd; d-- > 0;) {
      idx[d] = offset[d] + l % extent[d];
      l /= extent[d];
    }
    throw InputError(folder_ + ": tensor '" + name + "': no shard holds element " + dims_text(idx) +
                     " (the checkpoint covers only part of it)");
  }
  return out;
}

}  // namespace tessel::rt
