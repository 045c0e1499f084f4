#include "tests/fuzz/checkpoint_fixture.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "util/json_reader.hpp"
#include "runtime/checkpoint/crc32c.hpp"
#include "runtime/checkpoint/shard_file.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace tessel::fuzz {

std::string fixture_meta_json() {
  const Json meta = {{"format", "tessel-checkpoint"}, {"step", 1}, {"world", 1}, {"meta", {{"model", "tiny"}}}};
  return meta.dump(2) + "\n";
}

std::string fixture_manifest_json(std::string_view meta, std::string_view shard) {
  Json files = Json::array();
  files.push_back({{"name", "meta.json"}, {"bytes", meta.size()}, {"crc32c", rt::crc_hex(rt::crc32c(meta.data(), meta.size()))}});
  files.push_back({{"name", "rank-00000.shard"}, {"bytes", shard.size()},
                   {"crc32c", rt::crc_hex(rt::crc32c(shard.data(), shard.size()))}});
  const Json manifest = {{"format", "tessel-checkpoint"}, {"version", 1}, {"step", 1}, {"world", 1},
                         {"checksum", "crc32c"}, {"files", files}};
  return manifest.dump(2) + "\n";
}

std::string fixture_shard_bytes() {
  // Written with the real ShardWriter (so the fixture follows the format), then read back as bytes.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tessel-fuzz-fixture-" + std::to_string(::getpid()) + ".shard")).string();
  {
    rt::ShardWriter w(path, 0, 1);
    std::vector<float> wv(12), bv(5);
    for (std::size_t i = 0; i < wv.size(); ++i) wv[i] = 0.5f * static_cast<float>(i);
    for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = -1.0f * static_cast<float>(i);
    w.add_tensor("w", {4, 3}, {0, 0}, {4, 3}, wv.data());
    w.add_tensor("b", {5}, {0}, {5}, bv.data());
    w.add_blob("rng", "seed=1234");
    w.finish();
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::filesystem::remove(path);
  return ss.str();
}

void write_fixture_checkpoint(const std::string& dir) {
  const std::string meta = fixture_meta_json(), shard = fixture_shard_bytes();
  auto put = [&](const std::string& name, const std::string& bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out << bytes;
    FUZZ_CHECK(out.good(), "cannot write the checkpoint fixture");
  };
  put("meta.json", meta);
  put("rank-00000.shard", shard);
  put("manifest.json", fixture_manifest_json(meta, shard));
}

}  // namespace tessel::fuzz
