// Fuzz targets for recovery checkpoints: the manifest (JSON) and a shard file (binary headers + data).
// Both go through CheckpointReader exactly as `tessel run --resume` does, then every tensor and blob is
// read back, so a header that claims more than the file holds must fail before anything is allocated.
//
// The shard target writes its input as the only shard of a one-rank checkpoint and a manifest with the
// input's true size and CRC32C, so the fuzzer reaches the header parser and the slice assembly instead of
// stopping at the checksum. The manifest target pairs its input with a fixed valid meta.json and shard.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/crc32c.hpp"
#include "tests/fuzz/checkpoint_fixture.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/fuzz/targets.hpp"

namespace tessel::fuzz {

namespace fs = std::filesystem;

const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/tessel-fuzz-XXXXXX";
    FUZZ_CHECK(::mkdtemp(templ.data()) != nullptr, "cannot create a scratch folder");
    static const std::string keep = templ;
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(keep, ec);
    });
    return templ;
  }();
  return dir;
}

namespace {
void write_bytes(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  FUZZ_CHECK(out.good(), "cannot write a scratch file");
}

// Everything a resume would read.
void read_everything(const std::string& dir) {
  rt::CheckpointReader r(dir);
  for (const std::string& name : r.tensor_names()) {
    const std::vector<float> v = r.read_tensor(name);
    std::uint64_t n = 1;
    for (auto d : r.shape(name)) n *= d;
    FUZZ_CHECK(v.size() == n, "read_tensor returned the wrong element count");
  }
  for (int rank = 0; rank < r.world(); ++rank)
    for (const char* blob : {"rng", "data"}) {
      try {
        (void)r.read_blob(blob, rank);
      } catch (const InputError&) {
        // a missing blob is an expected rejection; anything else propagates
      }
    }
}
}  // namespace

void checkpoint_shard(std::string_view data) {
  const std::string dir = scratch_dir() + "/shard-case";
  fs::create_directories(dir);
  const std::string meta = fixture_meta_json();
  write_bytes(dir + "/meta.json", meta);
  write_bytes(dir + "/rank-00000.shard", data);
  write_bytes(dir + "/manifest.json", fixture_manifest_json(meta, data));
  read_everything(dir);
}

void checkpoint_manifest(std::string_view data) {
  static const std::string dir = [] {
    const std::string d = scratch_dir() + "/manifest-case";
    fs::create_directories(d);
    write_fixture_checkpoint(d);
    return d;
  }();
  write_bytes(dir + "/manifest.json", data);
  read_everything(dir);
}

}  // namespace tessel::fuzz
