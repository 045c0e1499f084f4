// Writes the binary seeds of the checkpoint fuzz targets with the real writer, so the committed corpus
// follows the format: make_fuzz_seeds <tests/fuzz/corpus>. Text formats are seeded from the project's own
// files by tools/fuzz_seed_corpus.sh.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/checkpoint/shard_file.hpp"
#include "tests/fuzz/checkpoint_fixture.hpp"

namespace fs = std::filesystem;
using namespace tessel;

namespace {
void put(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A shard holding the lower half of a [4, 6] tensor only (a piece of a tensor-parallel save): reading the
// whole tensor must be refused as not covered, not filled with garbage.
std::string partial_shard() {
  const fs::path p = fs::temp_directory_path() / ("tessel-seed-" + std::to_string(::getpid()) + ".shard");
  {
    rt::ShardWriter w(p.string(), 0, 1);
    std::vector<float> v(12, 1.5f);
    w.add_tensor("layers.0.mlp.fc1.weight", {4, 6}, {2, 0}, {2, 6}, v.data());
    w.add_blob("rng", std::string(16, '\x7f'));
    w.finish();
  }
  std::string bytes = slurp(p);
  fs::remove(p);
  return bytes;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds <corpus folder>\n");
    return 2;
  }
  const fs::path root = argv[1];
  const std::string meta = fuzz::fixture_meta_json(), shard = fuzz::fixture_shard_bytes(), partial = partial_shard();
  put(root / "checkpoint_shard" / "valid.shard", shard);
  put(root / "checkpoint_shard" / "partial_piece.shard", partial);
  put(root / "checkpoint_shard" / "truncated.shard", shard.substr(0, shard.size() / 2));
  put(root / "checkpoint_manifest" / "valid.json", fuzz::fixture_manifest_json(meta, shard));
  // A manifest whose CRC does not match the shard: the reader must name the corrupted file.
  std::string bad = fuzz::fixture_manifest_json(meta, shard + "x");
  put(root / "checkpoint_manifest" / "wrong_crc.json", bad);
  return 0;
}
