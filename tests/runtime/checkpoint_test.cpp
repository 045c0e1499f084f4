// Recovery checkpoints: format round trip, resharding on load, the published step (`latest`) and strict
// step folder names, and the faults of issues 6 and 9: corruption and truncation found by checksum, another
// model refused, disk full, absurd headers rejected without allocating. Then the runtime's metadata: the data
// position and source, strict keys, and ranks that agree on a failed resume.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>

#include "util/error.hpp"
#include "runtime/checkpoint/crc32c.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "tests/runtime/checkpoint_util.hpp"
#include "tests/runtime/runtime_test_util.hpp"

using namespace tessel;
using namespace tessel::rt;
using test::weight;

namespace {
const Json kModel = {{"name", "tiny"}, {"layers", 2}, {"hidden", 64}};

void save(const std::string& dir, std::int64_t step, int world, std::uint64_t rows = 8, std::uint64_t cols = 6) {
  run_threads(world, [&](Comm& c) {
    CheckpointWriter w(dir, step, c);
    test::save_rows(w, c.rank(), world, rows, cols);
    w.set_metadata({{"model", kModel}, {"data_position", 1234}});
    w.commit();
  });
}
}  // namespace

TEST_CASE("crc32c matches the RFC 3720 check value and extends") {
  // CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720 B.4; Castagnoli et al. 1993).
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  CHECK(crc32c_extend(crc32c("12345", 5), "6789", 4) == 0xE3069283u);
  CHECK(crc_hex(0xE3069283u) == "e3069283");
}

TEST_CASE("a checkpoint saved by 4 ranks loads under other layouts") {
  test::TempDir d("reshard");
  save(d.str(), 10, 4);
  CheckpointReader r(d.str());
  CHECK(r.step() == 10);
  CHECK(r.world() == 4);
  CHECK(r.metadata()["data_position"] == 1234);
  CHECK(r.tensor_names() == std::vector<std::string>{"b", "optim.m.w", "w"});
  CHECK(r.shape("w") == Shape{8, 6});
  // tp1: the full tensor. Expected (i, j) -> weight(1, i, j) for all 48 elements.
  auto full = r.read_tensor("w");
  REQUIRE(full.size() == 48);
  for (std::uint64_t i = 0; i < 8; ++i)
    for (std::uint64_t j = 0; j < 6; ++j) CHECK(full[i * 6 + j] == weight(1, i, j));
  // A column shard (another layout) crossing all four saved row pieces: rows 1..6, cols 3..5.
  auto cut = r.read_slice("optim.m.w", {1, 3}, {6, 2});
  REQUIRE(cut.size() == 12);
  for (std::uint64_t i = 0; i < 6; ++i)
    for (std::uint64_t j = 0; j < 2; ++j) CHECK(cut[i * 2 + j] == weight(2, 1 + i, 3 + j));
  CHECK(r.read_slice("b", {2}, {3}) == std::vector<float>{weight(3, 0, 2), weight(3, 0, 3), weight(3, 0, 4)});
  CHECK(r.read_slice("w", {8, 0}, {0, 6}).empty());
  for (int k = 0; k < 4; ++k) CHECK(r.read_blob("rng", k) == "rng-of-" + std::to_string(k));
  CHECK_THROWS_WITH_AS(r.read_slice("w", {7, 0}, {2, 6}), doctest::Contains("leaves the tensor's shape [8, 6]"), InputError);
  CHECK_THROWS_WITH_AS(r.read_tensor("nope"), doctest::Contains("no tensor 'nope'"), InputError);
  // The same checkpoint read from 2 "ranks" with a 2-way row split gives each its half.
  auto top = r.read_slice("w", {0, 0}, {4, 6});
  CHECK(std::equal(top.begin(), top.end(), full.begin()));
}

TEST_CASE("a region that no shard holds is named") {
  test::TempDir d("gap");
  run_threads(2, [&](Comm& c) {
    CheckpointWriter w(d.str(), 1, c);
    std::vector<float> x(3, 1.0f);
    if (c.rank() == 1) w.add_tensor("x", {6}, {3}, {3}, x.data());  // elements 0..2 never saved
    w.commit();
  });
  CheckpointReader r(d.str());
  CHECK(r.read_slice("x", {3}, {3}) == std::vector<float>{1, 1, 1});
  // Counted before anything is allocated (a header can declare a shape its files do not carry).
  CHECK_THROWS_WITH_AS(r.read_tensor("x"), doctest::Contains("tensor 'x': its shards hold 3 of the 6 elements"), InputError);
}

TEST_CASE("the published step is loaded; staging folders and `latest` follow the protocol") {
  test::TempDir d("latest");
  save(d.str(), 10, 2);
  save(d.str(), 20, 2);
  // A save killed before publishing leaves only a staging folder: it must be ignored.
  test::fs::create_directories(d.path / ".step-00000030.staging");
  // A folder without manifest is not complete either.
  test::fs::create_directories(d.path / "step-00000040");
  CHECK(CheckpointReader::latest_step(d.str()) == 20);
  CHECK(CheckpointReader(d.str()).step() == 20);
  CHECK(CheckpointReader((d.path / "step-00000010").string()).step() == 10);
  CHECK(test::file_bytes(d.path / "latest") == "step-00000020\n");
  CHECK(!CheckpointReader::latest_step((d.path / "nothing").string()));
  CHECK_THROWS_WITH_AS(CheckpointReader((d.path / "nothing").string()), doctest::Contains("no such checkpoint folder"), InputError);
  // An existing step is never overwritten.
  CHECK_THROWS_WITH_AS(save(d.str(), 20, 2), doctest::Contains("exists; not overwriting it"), InputError);
  CHECK(CheckpointReader(d.str()).read_tensor("w") == CheckpointReader((d.path / "step-00000010").string()).read_tensor("w"));
}

TEST_CASE("corrupted and truncated shards are found by their checksum, naming the file") {
  test::TempDir d("corrupt");
  save(d.str(), 5, 2);
  auto shard = d.path / "step-00000005" / "rank-00001.shard";
  std::string bytes = test::file_bytes(shard);
  SUBCASE("one flipped bit") {
    bytes[bytes.size() / 2] ^= 0x10;
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
    CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("rank-00001.shard: CRC32C"), InputError);
  }
  SUBCASE("truncated") {
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 7);
    std::string expect = "rank-00001.shard: " + std::to_string(bytes.size() - 7) + " bytes, the manifest says";
    CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains(expect.c_str()), InputError);
  }
  SUBCASE("missing") {
    test::fs::remove(shard);
    CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("rank-00001.shard: listed in the manifest"), InputError);
  }
}

TEST_CASE("non-finite values with valid checksums are refused, naming the tensor, the element and the shard") {
  // Rank 1 saves rows 4..7 of "optim.m.w" ([8, 6], row-split over 2 ranks, save_rows); a NaN is put at its
  // local row 1, column 2 before the save, so the checksums are the true ones of the NaN: global element
  // [4 + 1, 2] = [5, 2] of the tensor, in rank-00001.shard. An infinity in "w" on rank 0 at [0, 3] likewise.
  test::TempDir d("nonfinite");
  for (const bool nan : {true, false}) {
    CAPTURE(nan);
    test::fs::remove_all(d.path);
    run_threads(2, [&](Comm& c) {
      CheckpointWriter w(d.str(), 3, c);
      const std::uint64_t rows = 8, cols = 6, per = 4;
      for (const char* name : {"w", "optim.m.w"}) {
        std::vector<float> piece(per * cols, 0.25f);
        if (nan && c.rank() == 1 && std::string(name) == "optim.m.w") piece[1 * cols + 2] = std::nanf("");
        if (!nan && c.rank() == 0 && std::string(name) == "w") piece[0 * cols + 3] = -INFINITY;
        w.add_tensor(name, {rows, cols}, {c.rank() * per, 0}, {per, cols}, piece.data());
      }
      w.commit();
    });
    CheckpointReader r(d.str());  // the checksums hold: opening succeeds
    const std::string shard = (d.path / "step-00000003" / (nan ? "rank-00001.shard" : "rank-00000.shard")).string();
    const std::string expect = nan ? shard + ": tensor 'optim.m.w' element [5, 2] is nan"
                                   : shard + ": tensor 'w' element [0, 3] is -inf";
    CHECK_THROWS_WITH_AS(r.read_tensor(nan ? "optim.m.w" : "w"), doctest::Contains(expect.c_str()), InputError);
    // A slice that does not hold the value reads (the check is on what is loaded); the other tensor is clean.
    CHECK(r.read_slice(nan ? "optim.m.w" : "w", {nan ? 0u : 4u, 0}, {4, 6}).size() == 24);
    CHECK(r.read_tensor(nan ? "w" : "optim.m.w").size() == 48);
  }
}

TEST_CASE("an unreadable checkpoint file or folder is reported as unreadable, with the reason, not as corrupt") {
  // Permission bits do not stop root, who runs CI, so the plan's `unreadable` makes every open, stat and
  // listing of one path (and of paths under it) fail with EACCES, as mode 600 or 700 of another user's would.
  test::TempDir d("unreadable");
  save(d.str(), 5, 2);
  const test::fs::path step = d.path / "step-00000005";
  const std::string denied = std::string(": cannot be read: ") + std::strerror(EACCES);
  struct Case {
    test::fs::path path;     // made unreadable
    test::fs::path named;    // the path the message names
  };
  const std::vector<Case> cases = {
      {step / "rank-00001.shard", step / "rank-00001.shard"},  // was "CRC32C 00000000 ... (the file is corrupted)"
      {step / "meta.json", step / "meta.json"},                // likewise
      {step / "manifest.json", step / "manifest.json"},
      {d.path / "latest", d.path / "latest"},                  // was "latest: holds \"\""
      {step, step / "manifest.json"},                          // was "not a complete checkpoint (no ...)"
  };
  for (const Case& c : cases) {
    const std::string path = c.path.string();
    const std::string expect = c.named.string() + denied;
    CAPTURE(path);
    set_fault_plan({0, 0, path});
    CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains(expect.c_str()), InputError);
    set_fault_plan({});
  }
  // A folder that cannot be listed: the run's check of --checkpoint-dir lists it.
  set_fault_plan({0, 0, d.str()});
  const std::string listing = d.str() + denied;
  CHECK_THROWS_WITH_AS(CheckpointReader::checkpoint_entries(d.str()), doctest::Contains(listing.c_str()), InputError);
  set_fault_plan({});
  CHECK(CheckpointReader(d.str()).step() == 5);  // the plan gone, the same checkpoint loads
  // Where permission bits do stop this user, the real thing: a shard of mode 000.
  if (::geteuid() == 0) {
    MESSAGE("running as root, whom mode 000 does not stop: the real permission case is left to the injected ones above");
  } else {
    test::fs::permissions(step / "rank-00000.shard", test::fs::perms::none);
    const std::string expect = (step / "rank-00000.shard").string() + denied;
    CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains(expect.c_str()), InputError);
    test::fs::permissions(step / "rank-00000.shard", test::fs::perms::owner_read | test::fs::perms::owner_write);
  }
}

TEST_CASE("meta.json and manifest.json that disagree on the step or the world name both files and values") {
  // The manifest is checksummed by nothing, so it is edited in place: a world-2 checkpoint's manifest made
  // to say world 1 (its file list cut to match) or step 6; meta.json, whose checksum still passes, says 2 and 5.
  test::TempDir d("disagree");
  save(d.str(), 5, 2);
  const test::fs::path step = d.path / "step-00000005";
  const std::string manifest = (step / "manifest.json").string(), meta = (step / "meta.json").string();
  const std::string original = test::file_bytes(manifest);
  Json m = Json::parse(original);
  m["world"] = 1;
  m["files"].erase(2);
  test::write_text(manifest, m.dump());
  const std::string world = meta + ": world: value 2 differs from the world of " + manifest + ", 1 (the two files must agree)";
  CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains(world.c_str()), InputError);
  m = Json::parse(original);
  m["step"] = 6;
  test::write_text(manifest, m.dump());
  const std::string step_rule = meta + ": step: value 5 differs from the step of " + manifest + ", 6 (the two files must agree)";
  CHECK_THROWS_WITH_AS(CheckpointReader(step.string()), doctest::Contains(step_rule.c_str()), InputError);
}

TEST_CASE("a checkpoint of another model is refused with the difference named") {
  test::TempDir d("model");
  save(d.str(), 1, 1);
  CheckpointReader r(d.str());
  r.check_model(kModel);  // same model: accepted
  Json other = kModel;
  other["hidden"] = 128;
  CHECK_THROWS_WITH_AS(r.check_model(other), doctest::Contains("model.hidden is 64 in the checkpoint, 128 here"), InputError);
  other = kModel;
  other["vocab"] = 256;
  CHECK_THROWS_WITH_AS(r.check_model(other), doctest::Contains("model.vocab is absent in the checkpoint, 256 here"), InputError);
}

TEST_CASE("disk full at any write of a save leaves the previous checkpoint intact") {
  // Count the I/O ops of one save of step 2 (after step 1), then fail each op in turn: every failure must
  // be an InputError on every rank, and step 1 must stay byte-identical and the newest complete step.
  test::TempDir d("enospc");
  save(d.str(), 1, 2, 64, 1024);  // 2 x 256 KiB per rank: several 64 KiB write ops per shard
  auto before = test::snapshot(d.path / "step-00000001");
  set_fault_plan({});
  save(d.str(), 2, 2, 64, 1024);
  long ops = io_ops_done();
  MESSAGE("I/O ops in one 2-rank save: " << ops);
  REQUIRE(ops > 10);
  int failures = 0, published = 0;
  for (long k = 1; k <= ops; ++k) {
    CAPTURE(k);
    test::fs::remove_all(d.path / "step-00000002");
    test::write_text(d.path / "latest", "step-00000001\n");
    set_fault_plan({0, k});
    std::string w;
    try {
      save(d.str(), 2, 2, 64, 1024);
    } catch (const InputError& e) {
      ++failures;
      w = e.what();
    }
    set_fault_plan({});
    CHECK_MESSAGE((w.find("No space left on device") != std::string::npos ||
                   w.find("Input/output error") != std::string::npos), w);
    // A failure after the rename that publishes step 2 (its folder fsync or the `latest` update) says so,
    // and step 2 is then complete; any earlier failure leaves step 1 the newest complete checkpoint.
    bool after_publish = w.find("was published but not confirmed durable") != std::string::npos;
    published += after_publish;
    CHECK(CheckpointReader::latest_step(d.str()) == (after_publish ? 2 : 1));
    CHECK(test::snapshot(d.path / "step-00000001") == before);
    CHECK(CheckpointReader(d.str()).read_tensor("w") == CheckpointReader((d.path / "step-00000001").string()).read_tensor("w"));
  }
  MESSAGE("failed ops tried: " << ops << ", of which after publishing: " << published);
  CHECK(published == 1);  // the rename of `latest` publishes; only the root's fsync after it follows
  CHECK(failures == ops);
}

TEST_CASE("absurd shard headers are rejected without allocating") {
  test::TempDir d("absurd");
  auto write_shard = [&](const std::string& name, auto&& fill) {
    std::string s("TSLSHARD", 8);
    auto u32 = [&](std::uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); };
    auto u64 = [&](std::uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); };
    fill(s, u32, u64);
    test::write_text(d.path / name, s);
    return (d.path / name).string();
  };
  auto header = [](std::string&, auto u32, auto) { u32(1), u32(0), u32(1), u32(0); };
  // A 2^20 x 2^20 = 2^40-element tensor: over the 2^36 limit, refused from the header alone.
  auto huge = write_shard("huge.shard", [&](std::string& s, auto u32, auto u64) {
    header(s, u32, u64);
    u32(1), u32(1), s += "w", u32(2);
    for (int dim = 0; dim < 2; ++dim) u64(1ull << 20), u64(0), u64(1ull << 20);
    u64(4ull << 40);
  });
  CHECK_THROWS_WITH_AS(read_shard_index(huge), doctest::Contains("more than the limit 2^36"), InputError);
  // Within limits but claiming 4 MiB of data that the file does not hold.
  auto shortf = write_shard("short.shard", [&](std::string& s, auto u32, auto u64) {
    header(s, u32, u64);
    u32(1), u32(1), s += "w", u32(1), u64(1 << 20), u64(0), u64(1 << 20), u64(4 << 20);
  });
  CHECK_THROWS_WITH_AS(read_shard_index(shortf), doctest::Contains("truncated?"), InputError);
  auto name = write_shard("name.shard", [&](std::string& s, auto u32, auto u64) { header(s, u32, u64), u32(1), u32(0xFFFFFFF0u); });
  CHECK_THROWS_WITH_AS(read_shard_index(name), doctest::Contains("name of 4294967280 bytes"), InputError);
  auto magic = write_shard("magic.shard", [&](std::string& s, auto, auto) { s[0] = 'X'; });
  CHECK_THROWS_WITH_AS(read_shard_index(magic), doctest::Contains("wrong magic"), InputError);
  auto version = write_shard("version.shard", [&](std::string&, auto u32, auto) { u32(7); });
  CHECK_THROWS_WITH_AS(read_shard_index(version), doctest::Contains("format version 7"), InputError);
  auto past = write_shard("past.shard", [&](std::string& s, auto u32, auto u64) {
    header(s, u32, u64);
    u32(1), u32(1), s += "w", u32(1), u64(4), u64(3), u64(2), u64(8);
  });
  CHECK_THROWS_WITH_AS(read_shard_index(past), doctest::Contains("exceeds the full size 4"), InputError);
}

TEST_CASE("`latest` decides which step a root loads; a complete folder above it is not published") {
  test::TempDir d("published");
  save(d.str(), 2, 1);
  save(d.str(), 4, 1);
  // Step 4's save stopped between its rename and `latest` (or step-00000004 came from elsewhere).
  test::write_text(d.path / "latest", "step-00000002\n");
  CHECK(CheckpointReader::latest_step(d.str()) == 2);
  CHECK(CheckpointReader(d.str()).step() == 2);
  // Without `latest` nothing is published; the message names the complete folder one may give instead.
  test::fs::remove(d.path / "latest");
  CHECK(!CheckpointReader::latest_step(d.str()));
  CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("no published checkpoint"), InputError);
  CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("step-00000004 there is complete but unpublished"),
                       InputError);
  CHECK(CheckpointReader((d.path / "step-00000004").string()).step() == 4);
  // `latest` naming a folder that is not complete.
  test::write_text(d.path / "latest", "step-00000006\n");
  CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("publishes step-00000006, which is not a complete checkpoint"),
                       InputError);
}

TEST_CASE("a save replaces an unpublished folder of its step, never a published one, and never moves `latest` back") {
  test::TempDir d("replace");
  save(d.str(), 1, 2);
  save(d.str(), 2, 2);
  // As if step 2's first save stopped after renaming its folder, before `latest`.
  test::write_text(d.path / "latest", "step-00000001\n");
  test::write_text(d.path / "step-00000002" / "left-by-the-first-try", "x");
  auto step1 = test::snapshot(d.path / "step-00000001");
  save(d.str(), 2, 2);
  CHECK(CheckpointReader::latest_step(d.str()) == 2);
  CHECK(!test::fs::exists(d.path / "step-00000002" / "left-by-the-first-try"));
  CHECK(!test::fs::exists(d.path / ".step-00000002.unpublished"));
  CHECK(CheckpointReader(d.str()).read_tensor("w") == CheckpointReader((d.path / "step-00000001").string()).read_tensor("w"));
  CHECK(test::snapshot(d.path / "step-00000001") == step1);
  CHECK_THROWS_WITH_AS(save(d.str(), 2, 2), doctest::Contains("exists; not overwriting it"), InputError);
  CHECK_THROWS_WITH_AS(save(d.str(), 0, 2), doctest::Contains("publishes step 2; a save of step 0 would move it back"),
                       InputError);
  CHECK(!test::fs::exists(d.path / "step-00000000"));
  CHECK(!test::fs::exists(d.path / ".step-00000000.staging"));
  CHECK(CheckpointReader::latest_step(d.str()) == 2);
}

TEST_CASE("step folder names are parsed exactly as the saver writes them") {
  CHECK(parse_step_folder_name("step-00000004") == 4);
  CHECK(parse_step_folder_name("step-00000000") == 0);
  CHECK(parse_step_folder_name("step-123456789") == 123456789);
  CHECK(parse_step_folder_name("step-999999999999999999") == kMaxStep);
  for (std::int64_t s : {std::int64_t(0), std::int64_t(7), std::int64_t(99999999), std::int64_t(100000000), kMaxStep})
    CHECK(parse_step_folder_name(step_folder_name(s)) == s);
  // Unpadded, over-padded, signs, spaces, 19 digits (over int64 for 9...9: no overflow), empty.
  for (const char* bad : {"step-4", "step-000000004", "step-0000000x", "step--0000004", "step-+0000004",
                          "step-00000004 ", "xtep-00000004", "step-", "step-9999999999999999999",
                          "step-1000000000000000000"}) {
    CAPTURE(bad);
    CHECK(!parse_step_folder_name(bad));
  }
}

TEST_CASE("a step folder must be named for its own step, exactly as the saver names it") {
  test::TempDir d("names");
  save(d.str(), 4, 1);
  const auto real = d.path / "step-00000004";
  test::fs::copy(real, d.path / "step-4", test::fs::copy_options::recursive);
  CHECK_THROWS_WITH_AS(CheckpointReader((d.path / "step-4").string()), doctest::Contains("the folder name 'step-4' is not one the saver writes"),
                       InputError);
  test::fs::copy(real, d.path / "step-99999999999", test::fs::copy_options::recursive);
  CHECK_THROWS_WITH_AS(CheckpointReader((d.path / "step-99999999999").string()),
                       doctest::Contains("named for step 99999999999 but its manifest.json says step 4"), InputError);
  // Through `latest` too, and a trailing slash changes nothing.
  test::write_text(d.path / "latest", "step-99999999999\n");
  CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("named for step 99999999999"), InputError);
  CHECK(CheckpointReader(real.string() + "/").step() == 4);
  // A `latest` that is not a name the saver writes: refused naming it, without parsing past 18 digits.
  for (const char* bad : {"step-4\n", "step-9999999999999999999\n", "step-00000004\n\n", "", "garbage\x01"}) {
    CAPTURE(bad);
    test::write_text(d.path / "latest", bad);
    CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("latest: holds"), InputError);
  }
  test::write_text(d.path / "latest", "step-00000004");  // without the newline: accepted
  CHECK(CheckpointReader(d.str()).step() == 4);
}

TEST_CASE("a `latest` that is a folder is refused before a save writes anything") {
  test::TempDir d("latest-dir");
  save(d.str(), 1, 2);
  test::fs::remove(d.path / "latest");
  test::fs::create_directories(d.path / "latest");
  CHECK_THROWS_WITH_AS(CheckpointReader(d.str()), doctest::Contains("latest: is a directory"), InputError);
  set_fault_plan({});
  CHECK_THROWS_WITH_AS(save(d.str(), 2, 2), doctest::Contains("latest: is a directory"), InputError);
  CHECK(io_ops_done() == 0);  // refused before the staging folder: no write, no mkdir
  CHECK(!test::fs::exists(d.path / "step-00000002"));
  CHECK(!test::fs::exists(d.path / ".step-00000002.staging"));
}

// --- the runtime's checkpoints (runtime/trainer_checkpoint.hpp) ---

namespace {
constexpr double kLossTol = 1e-6;  // fp32 sums of the same token losses in another order

// Rank 0's losses of `steps` steps of layout l (seed 1234, AdamW learning rate lr), resuming from / saving
// to a folder when given.
std::vector<double> train(const Layout& l, int steps, const std::string& resume, const std::string& save_to,
                          float lr = 1e-3f) {
  std::vector<double> losses;
  run_threads(l.gpus(), [&](Comm& world) {
    TrainOptions opt;
    opt.optimizer.adamw.lr = lr;
    Trainer t(test::micro_gpt(), l, opt, world, Recorder::Clock::now());
    if (!resume.empty()) load_checkpoint(t, resume, 1234);
    std::vector<double> mine;
    for (int i = 0; i < steps; ++i) mine.push_back(t.step().loss);
    if (!save_to.empty()) save_checkpoint(t, save_to, 1234);
    if (world.rank() == 0) losses = mine;
  });
  return losses;
}
}  // namespace

TEST_CASE("a resume continues from the consumed samples, also under another global batch size") {
  // With learning rate 0 the parameters never move (AdamW steps them by lr x ...), so a step's loss is the
  // mean token loss of its batch at the initial parameters. A gbs-8 run's steps 3 and 4 read samples
  // [16, 24) and [24, 32). Saved at step 2 (2 x 8 = 16 samples consumed) and resumed with gbs 16, step 3
  // must read [16, 32): its loss is the mean of 16 one-sample micro-batch means, (loss3 + loss4) / 2 of the
  // gbs-8 run.
  test::TempDir d("consumed"), d2("consumed2");
  const Layout g8 = test::layout(1, 1, 1, "1f1b", 1, 8);
  const auto whole = train(g8, 6, "", "", 0.0f);
  train(g8, 2, "", d.str(), 0.0f);
  CHECK(CheckpointReader(d.str()).metadata().value("consumed_samples", std::int64_t(-1)) == 16);
  const Layout g16 = test::layout(1, 1, 2, "1f1b", 1, 16);  // and dp 2: each replica its half of [16, 32)
  const auto resumed = train(g16, 1, d.str(), d2.str(), 0.0f);
  REQUIRE(resumed.size() == 1u);
  const double expected = (whole[2] + whole[3]) / 2;
  CHECK(test::rel_err(resumed[0], expected) < kLossTol);
  // The check can tell the batches apart: step x gbs would have read [32, 48), the gbs-8 run's steps 5-6.
  CHECK(test::rel_err((whole[4] + whole[5]) / 2, expected) > 10 * kLossTol);
  // 16 + 16 consumed when step 3 is saved.
  CHECK(CheckpointReader(d2.str()).metadata().value("consumed_samples", std::int64_t(-1)) == 32);
}

TEST_CASE("a resume refuses another data source or seed, naming both") {
  test::TempDir d("source");
  train(test::layout(1, 1, 1, "1f1b", 1, 4), 1, "", d.str());
  const Model m = test::micro_gpt();
  CHECK(check_resume(CheckpointReader(d.str()), m, 1234, "").consumed_samples == 4);
  const auto file = d.path / "tokens.txt";
  test::write_text(file, std::string(100, 'a'));
  CHECK_THROWS_WITH_AS(check_resume(CheckpointReader(d.str()), m, 1234, file.string()),
                       doctest::Contains("trained on synthetic tokens of seed 1234, this run reads the file 'tokens.txt' of 100 bytes"),
                       InputError);
  CHECK_THROWS_WITH_AS(check_resume(CheckpointReader(d.str()), m, 99, ""),
                       doctest::Contains("trained with seed 1234, this run uses 99"), InputError);
  // A checkpoint trained on a file resumes on the same name and size only.
  test::edit_meta(d.path / "step-00000001", [](Json& meta) {
    meta["data"] = {{"source", "file"}, {"name", "tokens.txt"}, {"bytes", 100}};
  });
  CHECK(check_resume(CheckpointReader(d.str()), m, 1234, file.string()).step == 1);
  test::write_text(file, std::string(101, 'a'));
  CHECK_THROWS_WITH_AS(check_resume(CheckpointReader(d.str()), m, 1234, file.string()),
                       doctest::Contains("trained on the file 'tokens.txt' of 100 bytes, this run reads the file 'tokens.txt' of 101 bytes"),
                       InputError);
  CHECK_THROWS_WITH_AS(check_resume(CheckpointReader(d.str()), m, 1234, ""),
                       doctest::Contains("this run reads synthetic tokens of seed 1234"), InputError);
}

TEST_CASE("the runtime's metadata is read strictly, naming meta.json, the key and the rule") {
  test::TempDir d("strict");
  train(test::layout(1, 1, 1, "1f1b", 1, 4), 1, "", d.str());
  const auto folder = d.path / "step-00000001";
  const std::string meta0 = test::file_bytes(folder / "meta.json"), man0 = test::file_bytes(folder / "manifest.json");
  const Model m = test::micro_gpt();
  struct Case {
    const char* what;
    std::function<void(Json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"seed text", [](Json& j) { j["seed"] = "abc"; }, "meta.seed: value \"abc\" must be an integer"},
      {"step missing", [](Json& j) { j.erase("step"); }, "meta.step: missing required key"},
      {"step text", [](Json& j) { j["step"] = "x"; }, "meta.step: value \"x\" must be an integer"},
      {"step negative", [](Json& j) { j["step"] = -3; }, "meta.step: value -3 is out of range"},
      {"step huge", [](Json& j) { j["step"] = 1e30; }, "must be an integer"},
      {"step not the manifest's", [](Json& j) { j["step"] = 0; },
       "meta.step: value 0 differs from the step of the folder and its manifest.json, 1"},
      {"consumed missing", [](Json& j) { j.erase("consumed_samples"); }, "meta.consumed_samples: missing required key"},
      {"consumed below step", [](Json& j) { j["consumed_samples"] = 0; },
       "meta.consumed_samples: value 0 is less than the step 1"},
      {"data source", [](Json& j) { j["data"]["source"] = "tape"; }, "meta.data.source"},
      {"data key", [](Json& j) { j["data"]["extra"] = 1; }, "meta.data.extra: unknown key"},
      {"unknown key", [](Json& j) { j["extra"] = 1; }, "meta.extra: unknown key"},
      {"model", [](Json& j) { j["model"] = 3; }, "meta.model: value 3 must be an object"},
      {"older format", [](Json& j) { j["format"] = "tessel-cpu-runtime-1"; },
       "meta.format: \"tessel-cpu-runtime-1\" is an older tessel's checkpoint"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    test::write_text(folder / "meta.json", meta0);
    test::write_text(folder / "manifest.json", man0);
    test::edit_meta(folder, c.edit);
    CHECK_THROWS_WITH_AS(check_resume(CheckpointReader(d.str()), m, 1234, ""), doctest::Contains(c.expect), InputError);
    CHECK_THROWS_WITH_AS(check_resume(CheckpointReader(d.str()), m, 1234, ""), doctest::Contains("meta.json: meta."),
                         InputError);
  }
  // The trainer's load goes through the same check: an InputError, not a JSON library exception.
  test::write_text(folder / "meta.json", meta0);
  test::write_text(folder / "manifest.json", man0);
  test::edit_meta(folder, [](Json& j) { j["seed"] = "abc"; });
  CHECK_THROWS_WITH_AS(train(test::layout(1, 1, 1, "1f1b", 1, 4), 1, d.str(), ""), doctest::Contains("meta.seed"), InputError);
}

TEST_CASE("a resume that fails on one rank fails on every rank, none going on") {
  // pp 2 splits the 8-layer micro GPT: rank 1 alone holds layers 4-7, so a checkpoint without layer 7's
  // tensors fails on rank 1 only. Rank 0 must not return from load_checkpoint (and report a resume) while
  // rank 1 failed; every rank stops with rank 1's message.
  test::TempDir full("agree-full"), part("agree-part");
  train(test::layout(1, 1, 1, "1f1b", 1, 4), 1, "", full.str());
  run_threads(1, [&](Comm& c) {
    CheckpointReader r(full.str());
    CheckpointWriter w(part.str(), r.step(), c);
    for (const std::string& n : r.tensor_names()) {
      if (n.find("layers.7.") != std::string::npos) continue;
      const auto v = r.read_tensor(n);
      w.add_tensor(n, r.shape(n), Shape(r.shape(n).size(), 0), r.shape(n), v.data());
    }
    w.set_metadata(r.metadata());
    w.commit();
  });
  std::atomic<int> returned{0};
  std::string what;
  try {
    run_threads(2, [&](Comm& world) {
      Trainer t(test::micro_gpt(), test::layout(1, 2, 1, "1f1b", 1, 4), {}, world, Recorder::Clock::now());
      load_checkpoint(t, part.str(), 1234);
      ++returned;
    });
  } catch (const InputError& e) {
    what = e.what();
  }
  CHECK(returned.load() == 0);
  CHECK_MESSAGE(what.find("rank 1: ") != std::string::npos, what);
  CHECK_MESSAGE(what.find("no tensor layers.7.") != std::string::npos, what);
}
