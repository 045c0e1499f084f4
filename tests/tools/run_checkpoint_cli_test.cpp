// tessel run's recovery-checkpoint flags from the command line: what is refused before any training (exit
// 2, no step trained, nothing saved), which step a resume takes and where its data continues.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/comm/thread_comm.hpp"
#include "tests/runtime/checkpoint_util.hpp"
#include "tests/tools/run_util.hpp"

namespace fs = std::filesystem;
using tessel::Json;
using tessel::test::RunResult;
using tessel::test::run_tessel;

namespace {

// A fresh folder for one test case, removed at its end.
struct Scratch {
  fs::path p;
  explicit Scratch(const std::string& tag)
      : p(fs::temp_directory_path() / ("tessel-ckcli-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~Scratch() {
    std::error_code ec;
    fs::permissions(p / "ro", fs::perms::owner_all, ec);
    fs::remove_all(p, ec);
  }
  std::string operator/(const std::string& name) const { return (p / name).string(); }
};

// `tessel run --backend cpu --model tiny` with more arguments.
RunResult run(std::vector<std::string> more) {
  std::vector<std::string> a = {"run", "--backend", "cpu", "--model", "tiny"};
  a.insert(a.end(), more.begin(), more.end());
  return run_tessel(a);
}

bool trained(const RunResult& r) { return r.out.find(" loss ") != std::string::npos; }
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("run: a fresh run into a folder holding checkpoints is refused before training") {
  Scratch s("fresh");
  const std::string d = s / "ck";
  REQUIRE(run({"--steps", "2", "--save-every", "2", "--checkpoint-dir", d}).code == 0);
  // Before: it trained steps 1-2 and died at the save of step 2 ("exists; not overwriting it").
  auto again = run({"--steps", "4", "--save-every", "2", "--checkpoint-dir", d});
  CAPTURE(again.err);
  CHECK(again.code == 2);
  CHECK(has(again.err, "--checkpoint-dir " + d + ": holds checkpoints already (latest publishes step-00000002; step-00000002)"));
  CHECK(has(again.err, "--resume " + d));
  CHECK(!trained(again));
  // Resuming it into the same folder is the way on.
  auto resumed = run({"--steps", "4", "--save-every", "2", "--checkpoint-dir", d, "--resume", d});
  CAPTURE(resumed.err);
  CHECK(resumed.code == 0);
  CHECK(tessel::test::file_bytes(fs::path(d) / "latest") == "step-00000004\n");
  // Into another folder holding checkpoints: refused as well, naming both.
  const std::string other = s / "other";
  REQUIRE(run({"--steps", "2", "--save-every", "2", "--checkpoint-dir", other}).code == 0);
  auto mixed = run({"--steps", "6", "--save-every", "2", "--checkpoint-dir", other, "--resume", d});
  CAPTURE(mixed.err);
  CHECK(mixed.code == 2);
  CHECK(has(mixed.err, "--checkpoint-dir " + other + ": holds other checkpoints"));
  CHECK(!trained(mixed));
  // Continuing an older step folder into the root whose `latest` is newer would save over steps 3-4.
  auto older = run({"--steps", "4", "--save-every", "2", "--checkpoint-dir", d, "--resume", d + "/step-00000002"});
  CAPTURE(older.err);
  CHECK(older.code == 2);
  CHECK(has(older.err, "step 2 is older than the one " + d + "/latest publishes (4)"));
}

TEST_CASE("run: a --checkpoint-dir that cannot take a save is refused before training") {
  Scratch s("dir");
  const std::string file = s / "a-file";
  tessel::test::write_text(file, "x");
  auto r = run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", file});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, "--checkpoint-dir " + file + ": is a file, not a folder"));
  CHECK(!trained(r));
  auto below = run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", file + "/ck"});
  CAPTURE(below.err);
  CHECK(below.code == 2);
  CHECK(has(below.err, "--checkpoint-dir " + file + "/ck: " + file + " is a file, not a folder"));
  CHECK(!trained(below));
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(s.p / "ro");
    fs::permissions(s.p / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    auto ro = run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", s / "ro/ck"});
    CAPTURE(ro.err);
    CHECK(ro.code == 2);
    CHECK(has(ro.err, "folder " + s / "ro" + " is not writable"));
    CHECK(!trained(ro));
  }
  // A step folder is not a root.
  REQUIRE(run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", s / "root"}).code == 0);
  const std::string step = s / "root/step-00000001";
  auto inside = run({"--steps", "2", "--save-every", "1", "--checkpoint-dir", step, "--resume", step});
  CAPTURE(inside.err);
  CHECK(inside.code == 2);
  CHECK(has(inside.err, "--checkpoint-dir " + step + ": is one step folder of a checkpoint"));
  CHECK(!trained(inside));
  // Folders that do not exist yet below a writable one are created by the saver.
  auto deep = run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", s / "a/b/c"});
  CAPTURE(deep.err);
  CHECK(deep.code == 0);
  CHECK(fs::exists(s.p / "a/b/c/step-00000001/manifest.json"));
}

TEST_CASE("run: a --save-every that would save nothing is refused") {
  Scratch s("every");
  const std::string d = s / "ck";
  auto r = run({"--steps", "3", "--save-every", "5", "--checkpoint-dir", d});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, "--save-every 5: must be <= --steps 3, or nothing would be saved"));
  CHECK(!trained(r));
  CHECK(!fs::exists(d));
  // Resumed at step 2, --steps 4 trains steps 3-4: --save-every 3 saves step 3, --save-every 5 nothing.
  REQUIRE(run({"--steps", "2", "--save-every", "2", "--checkpoint-dir", d}).code == 0);
  auto five = run({"--steps", "4", "--save-every", "5", "--checkpoint-dir", d, "--resume", d});
  CAPTURE(five.err);
  CHECK(five.code == 2);
  CHECK(has(five.err, "--save-every 5: this run trains steps 3 to 4 (resumed at step 2, --steps 4) and none is a multiple of 5"));
  auto three = run({"--steps", "4", "--save-every", "3", "--checkpoint-dir", d, "--resume", d});
  CAPTURE(three.err);
  CHECK(three.code == 0);
  CHECK(fs::exists(fs::path(d) / "step-00000003" / "manifest.json"));
}

TEST_CASE("run: a `latest` that is a folder is refused before training") {
  Scratch s("latestdir");
  const std::string d = s / "ck";
  REQUIRE(run({"--steps", "2", "--save-every", "2", "--checkpoint-dir", d}).code == 0);
  fs::remove(fs::path(d) / "latest");
  fs::create_directories(fs::path(d) / "latest");
  // Before: the resume loaded step 2, trained steps 3-4 and died at the save ("rename failed").
  auto r = run({"--steps", "4", "--save-every", "2", "--checkpoint-dir", d, "--resume", d});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, d + "/latest: is a directory"));
  CHECK(!trained(r));
  const std::string e = s / "empty";
  fs::create_directories(fs::path(e) / "latest");
  auto fresh = run({"--steps", "2", "--save-every", "2", "--checkpoint-dir", e});
  CAPTURE(fresh.err);
  CHECK(fresh.code == 2);
  CHECK(has(fresh.err, "--checkpoint-dir " + e + ": " + e + "/latest: is a directory"));
  CHECK(!trained(fresh));
}

TEST_CASE("run: --resume takes the step `latest` publishes, and continues from the consumed samples") {
  Scratch s("latest");
  const std::string d = s / "ck";
  REQUIRE(run({"--steps", "4", "--save-every", "2", "--gbs", "8", "--checkpoint-dir", d}).code == 0);
  // Step 4 as a save that stopped before `latest`: the resume takes step 2 (before: the highest folder, 4).
  tessel::test::write_text(fs::path(d) / "latest", "step-00000002\n");
  auto r = run({"--steps", "3", "--gbs", "4", "--resume", d});
  CAPTURE(r.err);
  CHECK(r.code == 0);
  // 2 steps x gbs 8 consumed; the next step reads from sample 16 whatever its global batch.
  CHECK(has(r.out, "resumed at step 2 (16 samples consumed)"));
  CHECK(has(r.out, "step    3  loss"));
}

TEST_CASE("run: a resumed run's trace records the number of its first step; a fresh run's does not") {
  Scratch s("firststep");
  const std::string d = s / "ck", fresh = s / "fresh.json", resumed = s / "resumed.json";
  REQUIRE(run({"--steps", "2", "--save-every", "2", "--checkpoint-dir", d, "--trace", fresh}).code == 0);
  auto r = run({"--steps", "4", "--resume", d, "--trace", resumed});
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  // Resumed at step 2, the run prints steps 3 and 4, and its trace says it starts at step 3 (2 + 1).
  CHECK(has(r.out, "step    3  loss"));
  CHECK(tessel::parse_json_file(resumed)["otherData"]["first_step"] == 3);
  CHECK(!tessel::parse_json_file(fresh)["otherData"].contains("first_step"));  // absent: from step 1
}

TEST_CASE("run: a resume refuses another data source") {
  Scratch s("data");
  const std::string d = s / "ck";
  REQUIRE(run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", d}).code == 0);
  const std::string text = s / "tokens.txt";
  tessel::test::write_text(text, std::string(4096, 'a'));
  auto r = run({"--steps", "2", "--resume", d, "--data", text});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, "trained on synthetic tokens of seed 1234, this run reads the file 'tokens.txt' of 4096 bytes"));
  CHECK(!trained(r));
}

TEST_CASE("run: a resume that fails on one rank stops every rank before any says it resumed") {
  // Under pp 2 rank 1 alone holds layers 4-7 of the 8-layer tiny model: a checkpoint without layer 7's
  // tensors fails on rank 1 only. Before, rank 0 printed "resumed at step 1" and then rank 1's error came.
  Scratch s("ranks");
  const std::string full = s / "full", part = s / "part";
  REQUIRE(run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", full}).code == 0);
  tessel::rt::run_threads(1, [&](tessel::rt::Comm& c) {
    tessel::rt::CheckpointReader r(full);
    tessel::rt::CheckpointWriter w(part, r.step(), c);
    for (const std::string& n : r.tensor_names()) {
      if (n.find("layers.7.") != std::string::npos) continue;
      const auto v = r.read_tensor(n);
      w.add_tensor(n, r.shape(n), tessel::rt::Shape(r.shape(n).size(), 0), r.shape(n), v.data());
    }
    w.set_metadata(r.metadata());
    w.commit();
  });
  auto r = run({"--pp", "2", "--steps", "2", "--resume", part});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, "rank 1: --resume " + part + ": no tensor layers.7."));
  CHECK(!has(r.out, "resumed at step"));
  CHECK(!trained(r));
}

TEST_CASE("run: a meta.json edited with its checksums recomputed is refused naming the key (exit 2)") {
  Scratch s("meta");
  const std::string d = s / "ck";
  REQUIRE(run({"--steps", "4", "--save-every", "4", "--checkpoint-dir", d}).code == 0);
  const fs::path folder = fs::path(d) / "step-00000004";
  const std::string meta0 = tessel::test::file_bytes(folder / "meta.json");
  const std::string man0 = tessel::test::file_bytes(folder / "manifest.json");
  struct Case {
    const char* what;
    Json value;  // of meta.step, or of meta.seed when seed is set
    bool seed;
    const char* expect;
  };
  // Before: "abc" and "x" were internal errors (exit 1), -3 resumed at step -3, 2 at step 2 and 1e30 at 0.
  const std::vector<Case> cases = {
      {"seed text", "abc", true, "meta.seed: value \"abc\" must be an integer"},
      {"step text", "x", false, "meta.step: value \"x\" must be an integer"},
      {"step negative", -3, false, "meta.step: value -3 is out of range"},
      {"step not the folder's", 2, false, "meta.step: value 2 differs from the step of the folder and its manifest.json, 4"},
      {"step huge", 1e30, false, "meta.step: value 1e+30 must be an integer"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    tessel::test::write_text(folder / "meta.json", meta0);
    tessel::test::write_text(folder / "manifest.json", man0);
    tessel::test::edit_meta(folder, [&](Json& meta) { meta[c.seed ? "seed" : "step"] = c.value; });
    auto r = run({"--steps", "6", "--resume", d});
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, (folder / "meta.json").string() + ": " + c.expect));
    CHECK(!trained(r));
  }
  tessel::test::write_text(folder / "meta.json", meta0);
  tessel::test::write_text(folder / "manifest.json", man0);
  tessel::test::edit_meta(folder, [](Json& meta) { meta.erase("step"); });
  auto missing = run({"--steps", "6", "--resume", d});
  CAPTURE(missing.err);
  CHECK(missing.code == 2);
  CHECK(has(missing.err, "meta.json: meta.step: missing required key"));
}

TEST_CASE("run: a checkpoint holding NaN with valid checksums is refused naming the tensor and shard (exit 2)") {
  // Before: it resumed, trained "loss nan" and exited 0. The copy is saved by 2 ranks: rank 1 writes the
  // poisoned tensor (the first exp_avg_sq, element 0 set to NaN), rank 0 everything else, so the message must
  // name rank-00001.shard; the checksums are computed over the NaN by the writer itself.
  Scratch s("nan");
  const std::string good = s / "good", bad = s / "bad";
  REQUIRE(run({"--steps", "1", "--save-every", "1", "--checkpoint-dir", good}).code == 0);
  std::string poisoned;
  for (const std::string& n : tessel::rt::CheckpointReader(good).tensor_names())
    if (poisoned.empty() && n.rfind("optim.exp_avg_sq.", 0) == 0) poisoned = n;
  tessel::rt::run_threads(2, [&](tessel::rt::Comm& c) {
    tessel::rt::CheckpointReader r(good);
    tessel::rt::CheckpointWriter w(bad, r.step(), c);
    for (const std::string& n : r.tensor_names()) {
      if ((c.rank() == 1) != (n == poisoned)) continue;
      auto v = r.read_tensor(n);
      if (n == poisoned) v[0] = std::nanf("");
      w.add_tensor(n, r.shape(n), tessel::rt::Shape(r.shape(n).size(), 0), r.shape(n), v.data());
    }
    w.set_metadata(r.metadata());
    w.commit();
  });
  REQUIRE(!poisoned.empty());
  auto r = run({"--steps", "2", "--resume", bad});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, "rank-00001.shard: tensor '" + poisoned + "' element [0"));
  CHECK(has(r.err, "is nan"));
  CHECK(!trained(r));
}
