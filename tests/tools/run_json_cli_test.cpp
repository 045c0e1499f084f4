// tessel run --json: one JSON document on stdout and nothing else there, the human lines on stderr; the
// document's fields against what they report (the CPU runtime's own numbers, the files on disk, the
// human lines), for the CPU backend (built `tessel`) and the CUDA backend (`tessel_fake`: the CUDA runtime's
// code on the fake CUDA runtime, tests/cuda_fake; its cases are skipped where it is not built).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "runtime/host_sched.hpp"
#include "runtime/trainer.hpp"
#include "tests/tools/run_util.hpp"
#include "traces/chrome.hpp"

namespace fs = std::filesystem;
using namespace tessel;
using tessel::test::RunResult;

namespace {

struct Scratch {
  fs::path p;
  explicit Scratch(const std::string& tag) : p(fs::temp_directory_path() / ("tessel-runjson-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
  std::string operator/(const std::string& name) const { return (p / name).string(); }
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The whole of stdout as one JSON document: anything else printed there fails the parse.
Json document(const RunResult& r) {
  CAPTURE(r.out);
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  Json j;
  REQUIRE_NOTHROW(j = Json::parse(r.out));
  return j;
}

// The bytes of the files of a folder, counted here.
std::int64_t folder_bytes(const std::string& folder) {
  std::int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(folder))
    if (e.is_regular_file()) n += static_cast<std::int64_t>(e.file_size());
  return n;
}

// The number after `key` in `text` (a human line), or NaN.
double number_after(const std::string& text, const std::string& key) {
  const auto at = text.find(key);
  return at == std::string::npos ? NAN : std::strtod(text.c_str() + at + key.size(), nullptr);
}

// The layout the commands below run: tp 2 pp 2, the default global batch mbs x dp x 2 x pp = 4.
Layout tp2_pp2() {
  Layout l;
  l.tp = 2;
  l.pp = 2;
  l.micro_batch = 1;
  l.global_batch = 4;
  l.precision = Precision::fp32;
  return l;
}

const char* fake_exe() { return std::getenv("TESSEL_FAKE_EXE"); }

}  // namespace

TEST_CASE("run --json (cpu): configuration, steps, every rank's memory, the checkpoint and the trace") {
  Scratch s("cpu");
  const RunResult r = test::run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--tp", "2", "--pp", "2", "--steps",
                                        "3", "--save-every", "2", "--checkpoint-dir", s / "ck", "--trace", s / "t.json",
                                        "--json"});
  const Json j = document(r);
  // The human lines went to stderr.
  CHECK(has(r.err, "tessel run: tiny, tp2 pp2"));
  CHECK(has(r.err, "\nstep    3 "));
  const Json& c = j.at("config");
  CHECK(c.at("backend") == "cpu");
  CHECK(c.at("comm") == "threads");
  CHECK(c.at("ranks") == 4);
  CHECK(c.at("model").at("name") == "tiny");
  CHECK(c.at("layout").at("tp") == 2);
  CHECK(c.at("layout").at("pp") == 2);
  CHECK(c.at("schedule") == "1f1b");
  CHECK(c.at("seed") == 1234);
  CHECK(c.at("steps") == 3);
  CHECK(c.at("first_step") == 1);
  CHECK(c.at("data").at("source") == "synthetic");
  CHECK(!c.at("gemm").get<std::string>().empty());
  // Steps 1-3: the losses and gradient norms of the CPU runtime on the same layout (deterministic for a
  // seed, and JSON carries doubles exactly), tokens/s = 4 samples x 32 tokens / seconds.
  const auto cpu = rt::train_threads(load_model("tiny"), tp2_pp2(), {}, 3);
  const Json& steps = j.at("steps");
  REQUIRE(steps.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    const Json& st = steps[std::size_t(i)];
    CHECK(st.at("step") == i + 1);
    CHECK(st.at("loss").get<double>() == cpu.steps[std::size_t(i)].loss);
    CHECK(st.at("grad_norm").get<double>() == cpu.steps[std::size_t(i)].grad_norm);
    CHECK(st.at("seconds").get<double>() > 0);
    CHECK(st.at("tokens_per_s").get<double>() == doctest::Approx(4.0 * 32 / st.at("seconds").get<double>()).epsilon(1e-12));
    // The ranks' CPU time and run-queue waits, summed over the 4 ranks, where the kernel counts them: no more
    // CPU than the host's cores give in the step, so a step's counters, not the run's so far (each rank counts
    // from its own exit of the step's barrier: 10 ms of slack for ranks leaving it apart on a loaded host).
    if (rt::thread_sched()) {
      const double cores = std::min(4u, std::max(1u, std::thread::hardware_concurrency()));
      CHECK(st.at("cpu_s").get<double>() > 0);
      CHECK(st.at("cpu_s").get<double>() <= cores * (st.at("seconds").get<double>() + 0.01));
      CHECK(st.at("run_delay_s").get<double>() >= 0);
    } else {
      CHECK_FALSE(st.contains("cpu_s"));
    }
  }
  // Every rank's memory in rank order: rank 0's as its human line says it (MiB to 3 decimals), and the
  // activation peaks the CPU runtime counted for the same run.
  const Json& mem = j.at("memory");
  REQUIRE(mem.size() == 4);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const Json& m = mem[std::size_t(rank)];
    CHECK(m.at("rank") == rank);
    CHECK(m.at("peak_activation_bytes").get<std::int64_t>() == cpu.peak_activation_bytes[std::size_t(rank)]);
    CHECK(m.at("parameter_bytes").get<std::int64_t>() == cpu.state_memory[std::size_t(rank)].weights);
    CHECK(m.at("peak_state_bytes").get<std::int64_t>() == cpu.state_memory[std::size_t(rank)].peak);
    CHECK(!m.contains("device_peak_bytes"));
  }
  const double mib = 1048576.0, half_unit = 0.0005 + 1e-9;  // 3 decimals printed
  CHECK(std::abs(mem[0].at("parameter_bytes").get<double>() / mib - number_after(r.err, "between steps (parameters ")) <= half_unit);
  CHECK(std::abs(mem[0].at("peak_activation_bytes").get<double>() / mib -
                 number_after(r.err, "peak activation memory on rank 0: ")) <= half_unit);
  // --save-every 2 of 3 steps: step 2's folder, with the bytes of its files on disk.
  const Json& saved = j.at("checkpoints").at("saved");
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].at("step") == 2);
  CHECK(fs::equivalent(saved[0].at("folder").get<std::string>(), s / "ck/step-00000002"));
  CHECK(saved[0].at("bytes").get<std::int64_t>() == folder_bytes(s / "ck/step-00000002"));
  CHECK(saved[0].at("seconds").get<double>() > 0);
  CHECK(j.at("checkpoints").at("resumed").is_null());
  // The trace: its file and its events, as written.
  CHECK(j.at("trace").at("file") == s / "t.json");
  CHECK(j.at("trace").at("events").get<std::size_t>() == trace::read_chrome_trace(s / "t.json").events.size());

  // Resumed from step 2 to step 4: the load reported with the same folder's bytes, steps 3-4 only.
  const RunResult again = test::run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--tp", "2", "--pp", "2",
                                            "--steps", "4", "--resume", s / "ck", "--json"});
  const Json k = document(again);
  CHECK(k.at("config").at("first_step") == 3);
  REQUIRE(k.at("steps").size() == 2);
  CHECK(k.at("steps")[0].at("step") == 3);
  CHECK(k.at("steps")[0].at("loss").get<double>() == cpu.steps[2].loss);  // continues the uninterrupted run
  const Json& resumed = k.at("checkpoints").at("resumed");
  CHECK(resumed.at("step") == 2);
  CHECK(resumed.at("bytes") == saved[0].at("bytes"));
  CHECK(resumed.at("seconds").get<double>() > 0);
  CHECK(k.at("checkpoints").at("saved").empty());
  CHECK(k.at("trace").is_null());
}

TEST_CASE("run --attention-kernel is refused on the CPU backend, naming the flag and the rule") {
  const RunResult r = test::run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--attention-kernel", "flash"});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(has(r.err, "--attention-kernel flash: only with --backend cuda"));
  CHECK(r.out.empty());
}

TEST_CASE("run --json (cuda, --gpu-threads): the CUDA runtime's document" * doctest::skip(fake_exe() == nullptr)) {
  const RunResult r = test::run_exe(fake_exe(), {"run", "--backend", "cuda", "--gpu-threads", "--model", "tiny", "--tp",
                                                 "2", "--pp", "2", "--precision", "fp32", "--steps", "3", "--json"});
  const Json j = document(r);
  CHECK(has(r.err, "4 rank(s) as threads on one GPU"));
  // Summary on stderr: the median of steps 2-3; no MFU, the ranks sharing one device.
  CHECK(has(r.err, "summary: median step "));
  CHECK(has(r.err, "over 2 step(s) after the first"));
  CHECK(has(r.err, "MFU n/a (the ranks share one GPU)"));
  const Json& c = j.at("config");
  CHECK(c.at("backend") == "cuda");
  CHECK(c.at("comm") == "staged:threads");
  CHECK(c.at("mode") == "gpu_threads");
  CHECK(c.at("ranks") == 4);
  CHECK(c.at("precision") == "fp32");
  CHECK(c.at("attention_kernel") == "default");
  CHECK(has(c.at("device").get<std::string>(), "fake device"));
  CHECK(c.at("first_step") == 1);
  // The CUDA runtime's fp32 run against the CPU runtime's, within the tolerance of the fake CUDA run's own
  // comparison (tests/cuda_fake/test_run_cuda_fake.cpp: 2e-6 of the loss, 1e-4 of the norm).
  const auto cpu = rt::train_threads(load_model("tiny"), tp2_pp2(), {}, 3);
  REQUIRE(j.at("steps").size() == 3);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    const Json& st = j.at("steps")[std::size_t(i)];
    CHECK(st.at("step") == i + 1);
    CHECK(st.at("loss").get<double>() == doctest::Approx(cpu.steps[std::size_t(i)].loss).epsilon(2e-6));
    CHECK(st.at("grad_norm").get<double>() == doctest::Approx(cpu.steps[std::size_t(i)].grad_norm).epsilon(1e-4));
  }
  REQUIRE(j.at("memory").size() == 4);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const Json& m = j.at("memory")[std::size_t(rank)];
    CHECK(m.at("rank") == rank);
    CHECK(m.at("device_peak_bytes").get<std::int64_t>() >= m.at("parameter_bytes").get<std::int64_t>());
    CHECK(m.at("device_reserved_bytes").get<std::int64_t>() >= m.at("device_peak_bytes").get<std::int64_t>());
    CHECK(!m.contains("peak_activation_bytes"));
  }
  CHECK(j.at("model_flops_per_step").get<double>() > 0);
}

TEST_CASE("run --json (cuda, --only-rank under ZeRO-3): one rank's document" * doctest::skip(fake_exe() == nullptr)) {
  const RunResult r = test::run_exe(fake_exe(), {"run", "--backend", "cuda", "--model", "tiny", "--pp", "2", "--dp",
                                                 "2", "--zero", "3", "--only-rank", "3", "--steps", "2", "--json"});
  const Json j = document(r);
  CHECK(has(r.err, "only rank 3"));
  CHECK(has(r.err, "ZeRO-3 shards"));
  CHECK(has(r.err, "MFU n/a (no system preset matches device 'fake device"));
  CHECK(j.at("config").at("mode") == "only_rank");
  CHECK(j.at("config").at("only_rank") == 3);
  CHECK(j.at("config").at("comm") == "none");
  CHECK(j.at("config").at("precision") == "bf16");
  REQUIRE(j.at("memory").size() == 1);
  CHECK(j.at("memory")[0].at("rank") == 3);
  // Rank 0's human memory line is this rank's: state between steps in MiB to 1 decimal.
  const Json& m = j.at("memory")[0];
  const double state = (m.at("parameter_bytes").get<double>() + m.at("gradient_bytes").get<double>() +
                        m.at("optimizer_bytes").get<double>()) / 1048576.0;
  CHECK(std::abs(state - number_after(r.err, "state between steps ")) <= 0.05 + 1e-9);
  CHECK(j.at("steps").size() == 2);
}

// The attention kernel is chosen by --attention-kernel; the environment variables that once chose it are
// refused (exit 2, naming the variable and the flag), so a script still setting them cannot measure the
// default kernel in the belief it measured another.
TEST_CASE("run --backend cuda refuses the attention environment variables of old" * doctest::skip(fake_exe() == nullptr)) {
  for (const char* name : {"TESSEL_ATTENTION", "TESSEL_ATTENTION_SWIZZLE", "TESSEL_ATTENTION_OVERLAP"}) {
    CAPTURE(name);
    ::setenv(name, "1", 1);
    const RunResult r = test::run_exe(fake_exe(), {"run", "--backend", "cuda", "--model", "tiny", "--steps", "1"});
    ::unsetenv(name);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, "environment " + std::string(name) + "=1: not read by tessel run; choose the attention kernel "
                     "with --attention-kernel NAME"));
    CHECK(!has(r.out, "step "));
  }
}

// tessel run takes the planning verbs' layout grammar and split flags: explore's words (with --gbs, which the
// words do not carry) and --stage-layers. tiny's 8 layers as 3 + 5 at pp 2, and as an interleaved pp 2 x vpp 2
// split 1,3,2,2 under PyTorch's micro-batch rule with m = 3 (not a multiple of pp), reproduce the one-rank
// losses of the same batch within 1e-5 relative (fp32 sums in another order, as tests/runtime).
TEST_CASE("run --layout words and --stage-layers: uneven splits give the one-rank losses") {
  const auto losses = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"run", "--backend", "cpu", "--model", "tiny", "--steps", "3", "--gbs", "3", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = test::run_tessel(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    std::vector<double> out;
    const Json doc = Json::parse(r.out);
    for (const auto& st : doc.at("steps")) out.push_back(st.at("loss").get<double>());
    REQUIRE(out.size() == 3u);
    return out;
  };
  const std::vector<double> one = losses({});
  const std::vector<double> flags = losses({"--pp", "2", "--stage-layers", "3,5"});
  const std::vector<double> words = losses({"--layout", "tp1 pp2 dp1 vpp2 mbs1 interleaved mb-rule=torch layers=1,3,2,2"});
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(std::abs(flags[k] - one[k]) <= 1e-5 * std::abs(one[k]));
    CHECK(std::abs(words[k] - one[k]) <= 1e-5 * std::abs(one[k]));
  }
}
