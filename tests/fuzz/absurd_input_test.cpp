// Valid syntax, absurd values: every parser rejects them with an InputError naming the field and the rule,
// and does so before allocating what the input asks for. "Before allocating" is measured: alloc_probe
// records the largest single operator-new request made while the parser ran, which must stay under
// kAllocBudget (a parser reading a few hundred bytes of input has no reason to ask for more).
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "models/model.hpp"
#include "util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/shard_file.hpp"
#include "sim/layout.hpp"
#include "sim/schedule/schedule.hpp"
#include "sim/system.hpp"
#include "tests/fuzz/alloc_probe.hpp"
#include "tests/fuzz/checkpoint_fixture.hpp"
#include "tests/fuzz/targets.hpp"
#include "traces/chrome.hpp"
#include "traces/kineto.hpp"

using namespace tessel;
namespace fs = std::filesystem;

namespace {
// 16 MiB: 100x the inputs below, far below any of the sizes they claim (>= 2^32 elements or ranks).
constexpr std::size_t kAllocBudget = std::size_t{16} << 20;

// Runs `parse`, expects an InputError whose message contains every one of `words`, and checks the largest
// allocation made meanwhile.
void expect_rejected(const std::function<void()>& parse, std::initializer_list<const char*> words) {
  std::string msg;
  fuzz::reset_largest_allocation();
  try {
    parse();
  } catch (const InputError& e) {
    msg = e.what();
  }
  const std::size_t largest = fuzz::largest_allocation();
  INFO("message: " << msg);
  REQUIRE_FALSE(msg.empty());
  for (const char* w : words) CHECK(msg.find(w) != std::string::npos);
  CHECK(largest < kAllocBudget);
}

Json tiny_model_json() { return model_to_json(load_model("tiny")); }
Json a100_json() { return system_to_json(load_system("dgx-a100")); }

std::string write_temp(const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(fuzz::scratch_dir()) / "absurd";
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary | std::ios::trunc) << bytes;
  return (dir / name).string();
}

void put_u32(std::string& s, std::uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, std::uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
}  // namespace

TEST_CASE("model JSON: 0 layers, 1e30 hidden, inf, a 10^20-parameter model") {
  Json j = tiny_model_json();
  j["layers"] = 0;
  expect_rejected([&] { parse_model(j, "m.json"); }, {"m.json", "layers", "out of range"});
  j = tiny_model_json();
  j["hidden"] = 1e30;
  expect_rejected([&] { parse_model(j, "m.json"); }, {"hidden", "must be an integer"});
  // 1e400 overflows a double: nlohmann throws out_of_range (not parse_error), which escaped as an internal
  // error before (found by the fuzzer, tests/fuzz/regressions/model_json).
  expect_rejected([&] { parse_model(parse_json_text(R"({"name":"x","layers":1e400})", "m.json"), "m.json"); },
                  {"m.json", "malformed JSON", "number overflow"});
  // Each dimension at its own limit: 10^5 layers x (12 x 2^48) per layer ~ 10^20 parameters would
  // overflow the int64 counts; the size check refuses it with the estimate in the message.
  j = tiny_model_json();
  j["layers"] = 100000;
  j["hidden"] = 1 << 24;
  j["ffn"] = 1 << 24;
  j["heads"] = 1 << 16;
  j["kv_heads"] = 1 << 16;
  j["head_dim"] = 256;
  expect_rejected([&] { parse_model(j, "m.json"); }, {"m.json", "parameters", "limit"});
}

TEST_CASE("HF config and Megatron command line: 0 layers, 1e30 hidden, padded vocabulary overflow") {
  const Json hf = parse_json_text(R"({"num_hidden_layers":0,"hidden_size":64,"num_attention_heads":4,
      "vocab_size":100,"max_position_embeddings":16})", "config.json");
  expect_rejected([&] { import_hf_config(hf, "config.json"); }, {"config.json", "num_hidden_layers", "[1, 100000]"});
  const Json hf2 = parse_json_text(R"({"num_hidden_layers":2,"hidden_size":1e30,"num_attention_heads":4,
      "vocab_size":100,"max_position_embeddings":16})", "config.json");
  expect_rejected([&] { import_hf_config(hf2, "config.json"); }, {"hidden_size", "must be an integer"});
  expect_rejected([&] {
    import_megatron_args({"--num-layers", "0", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "4",
                          "--vocab-size", "16"}, "cmdline");
  }, {"--num-layers 0", "[1, 100000]"});
  expect_rejected([&] {
    import_megatron_args({"--num-layers", "2", "--hidden-size", "1e30", "--num-attention-heads", "2"}, "cmdline");
  }, {"--hidden-size 1e30"});
  // 2^16 x 2^16 = 2^32 overflowed int before the fix (UBSan: signed overflow); now a clear error.
  expect_rejected([&] {
    import_megatron_args({"--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "4",
                          "--vocab-file", "gpt2-vocab.json", "--tensor-model-parallel-size", "65536",
                          "--make-vocab-size-divisible-by", "65536"}, "cmdline");
  }, {"padded vocabulary", "exceeds 2^24"});
}

TEST_CASE("system JSON: NaN and infinite bandwidths, 1e30 GPUs per node") {
  // JSON has no NaN: a file can only say "NaN" (a string) or overflow a number to infinity.
  Json j = a100_json();
  j["network"]["nic_GBps"] = "NaN";
  expect_rejected([&] { parse_system(j, "s.json"); }, {"s.json", "network.nic_GBps", "must be a number"});
  j = a100_json();
  j["network"]["nic_GBps"] = std::numeric_limits<double>::quiet_NaN();
  expect_rejected([&] { parse_system(j, "s.json"); }, {"network.nic_GBps", "finite"});
  j = a100_json();
  j["node"]["intra_GBps"] = std::numeric_limits<double>::infinity();
  expect_rejected([&] { parse_system(j, "s.json"); }, {"node.intra_GBps", "finite"});
  j = a100_json();
  j["node"]["gpus_per_node"] = 1e30;
  expect_rejected([&] { parse_system(j, "s.json"); }, {"node.gpus_per_node"});
  j = a100_json();
  j["max_gpus"] = 1e30;
  expect_rejected([&] { parse_system(j, "s.json"); }, {"max_gpus"});
  // 2^32 + 16 used to narrow to a 16-wide tile through get<int>().
  j = a100_json();
  j["gpu"]["efficiency"]["gemm_tiles"] = Json::array({Json::array({4294967312LL, 128})});
  expect_rejected([&] { parse_system(j, "s.json"); }, {"gemm_tiles", "8 <= m, n <= 1024"});
}

TEST_CASE("layout JSON: 1e30 GPUs, a 2^80-GPU product, 0 micro-batch, fractional stage layers") {
  auto layout = [](const std::string& text) { return parse_layout(parse_json_text(text, "l.json"), "l.json"); };
  expect_rejected([&] { layout(R"({"tp":1e30,"micro_batch":1,"global_batch":8})"); }, {"l.json", "tp", "must be an integer"});
  // Each degree within 2^20, the product 2^80: overflowed Layout::gpus() (int) before the check.
  expect_rejected([&] { layout(R"({"tp":1048576,"pp":1048576,"dp":1048576,"cp":1048576,"micro_batch":1,"global_batch":8})"); },
                  {"tp*pp*dp*cp", "limit"});
  expect_rejected([&] { layout(R"({"micro_batch":0,"global_batch":8})"); }, {"micro_batch", "out of range"});
  expect_rejected([&] { layout(R"({"pp":2,"micro_batch":1,"global_batch":8,"stage_layers":[0.5,1.5]})"); },
                  {"stage_layers", "whole layer counts"});
}

TEST_CASE("schedule CSV and sidecar: a billion micro-batches, 2^24 claimed by a sidecar") {
  expect_rejected([&] { sched::parse_csv("0F999999999\n", "s.csv", std::nullopt); }, {"s.csv", "2^24 micro-batches"});
  expect_rejected([&] { sched::parse_csv("0F1234567890\n", "s.csv", std::nullopt); }, {"s.csv:1:1", "index too large"});
  expect_rejected([&] { sched::parse_meta_json(R"({"schema":1,"pp":1e30,"num_stages":1,"num_microbatches":1,"stage_to_rank":[0]})", "m.json"); },
                  {"m.json", "pp"});
  // Valid sidecar, absurd claim: 2^24 micro-batches for a 4-action file. Parsing allocates nothing per
  // micro-batch, and validation stops at its violation limit instead of walking 4 x 2^24 pairs.
  const auto meta = sched::parse_meta_json(
      R"({"schema":1,"pp":2,"num_stages":2,"num_microbatches":16777216,"stage_to_rank":[0,1]})", "m.json");
  fuzz::reset_largest_allocation();
  const sched::Schedule s = sched::parse_csv("0F0,0B0\n1F0,1B0\n", "s.csv", meta);
  const auto t0 = std::chrono::steady_clock::now();
  const sched::ValidationReport rep = sched::validate(s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_FALSE(rep.ok());
  CHECK(rep.violations.size() == 50);  // ValidateOptions::max_violations
  CHECK(fuzz::largest_allocation() < kAllocBudget);
  CHECK(secs < 5.0);  // was 2 x 2^24 map lookups (tens of seconds under ASan); now 50
}

TEST_CASE("traces: 10 million ranks in a Chrome trace and in a Kineto trace") {
  expect_rejected([&] {
    trace::parse_chrome_trace(R"([{"ph":"X","name":"a","pid":10000000,"tid":0,"ts":0,"dur":1,"args":{"op":"forward"}}])", "t.json");
  }, {"t.json", "pid 10000000", "not a rank"});
  expect_rejected([&] {
    trace::kineto::parse_kineto(R"({"schemaVersion":1,"distributedInfo":{"rank":0,"world_size":10000000},
      "traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":0,"dur":1}]})", "k.json");
  }, {"k.json", "distributedInfo.world_size", "10000000"});
  expect_rejected([&] {
    trace::kineto::parse_kineto(R"({"schemaVersion":1,"distributedInfo":{"rank":8,"world_size":8},
      "traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":0,"dur":1}]})", "k.json");
  }, {"distributedInfo.rank", "[0, 7]"});
}

TEST_CASE("checkpoint: a 2^40-element tensor header, a 4 GiB name, a world of 10^7 ranks") {
  auto header = [] {
    std::string s = "TSLSHARD";
    put_u32(s, 1);  // version
    put_u32(s, 0);  // rank
    put_u32(s, 1);  // world
    put_u32(s, 0);  // reserved
    return s;
  };
  // A tensor [2^20, 2^20] with its whole extent in this shard: 2^40 elements, 4 TiB of data claimed.
  std::string big = header();
  put_u32(big, 1);  // tensor
  put_u32(big, 1);
  big += "w";
  put_u32(big, 2);  // ndim
  for (int d = 0; d < 2; ++d) {
    put_u64(big, std::uint64_t{1} << 20);
    put_u64(big, 0);
    put_u64(big, std::uint64_t{1} << 20);
  }
  put_u64(big, (std::uint64_t{1} << 40) * 4);
  const std::string big_path = write_temp("big.shard", big);
  expect_rejected([&] { rt::read_shard_index(big_path); }, {"big.shard", "tensor 'w'", "2^36"});
  std::string name = header();
  put_u32(name, 2);  // blob
  put_u32(name, 0xFFFFFFFFu);
  const std::string name_path = write_temp("name.shard", name);
  expect_rejected([&] { rt::read_shard_index(name_path); }, {"name.shard", "4294967295 bytes"});
  // A blob claiming 2^62 bytes of data in a file of 40 bytes.
  std::string blob = header();
  put_u32(blob, 2);
  put_u32(blob, 1);
  blob += "b";
  put_u32(blob, 0);
  put_u64(blob, std::uint64_t{1} << 62);
  const std::string blob_path = write_temp("blob.shard", blob);
  expect_rejected([&] { rt::read_shard_index(blob_path); }, {"blob.shard", "truncated"});
  // A manifest claiming 10^7 ranks.
  const fs::path dir = fs::path(fuzz::scratch_dir()) / "absurd-ckpt";
  fs::create_directories(dir);
  fuzz::write_fixture_checkpoint(dir.string());
  Json m = parse_json_file((dir / "manifest.json").string());
  m["world"] = 10000000;
  std::ofstream(dir / "manifest.json", std::ios::trunc) << m.dump();
  expect_rejected([&] { rt::CheckpointReader r(dir.string()); }, {"manifest.json", "world", "out of range"});
}
