// The trace readers and `tessel compare` on real PyTorch profiler traces in ../shared/traces/kineto (HTA's
// samples). Linked with tests/shared_main.cpp: without ../shared the executable exits 77 (skipped); with it, a
// missing file fails.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "tests/test_paths.hpp"
#include "tests/traces/trace_fixtures.hpp"
#include "traces/chrome.hpp"
#include "traces/kineto.hpp"
#include "util/error.hpp"

using namespace tessel;
using namespace tessel::trace::kineto;

namespace {

std::string kineto_file(const std::string& name) {
  auto p = std::filesystem::path(test::shared_dir()) / "traces" / "kineto" / name;
  return std::filesystem::exists(p) ? p.string() : "";
}

struct Run {
  int rc;
  std::string out;
};

Run tessel_compare(const std::string& args) {
  std::string out = test::temp_path("cli-shared-stdout.txt");
  std::string cmd = "\"" + test::tessel_exe() + "\" compare " + args + " > \"" + out + "\" 2>&1";
  int status = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

}  // namespace

TEST_CASE("nccl_data: the 15 all-reduces and 6 broadcasts with sizes, groups and measured times") {
  std::string path = kineto_file("nccl_parser_config__nccl_data.json.gz");
  REQUIRE_MESSAGE(!path.empty(), "../shared/traces/kineto/nccl_parser_config__nccl_data.json.gz is missing");
  KinetoTrace k = import_kineto(path);
  // Source: ../shared/traces/kineto/README.md and reference/ecosystem.md: rank 0 of 2, A100-PG509-200,
  // 15 x ncclKernel_AllReduce (Float) and 6 x ncclKernel_Broadcast kernels, all with collective args.
  CHECK(k.rank == 0);
  CHECK(k.world_size == 2);
  CHECK(k.device_name == "NVIDIA A100-PG509-200");
  REQUIRE(k.collectives.size() == 21);
  CHECK(k.unattributed_nccl_kernels == 0);
  std::vector<const Collective*> ar;
  for (const auto& c : k.collectives) {
    if (c.name == "allreduce") ar.push_back(&c);
    CHECK(c.group_size == 2);
    CHECK(c.duration_us > 0);
  }
  REQUIRE(ar.size() == 15);
  // The kernel quoted in ecosystem.md: allreduce of 6637568 Float, dur 2636.669 µs; bytes = 6637568 x 4.
  const Collective* quoted = nullptr;
  for (auto* c : ar) {
    if (c->in_nelems == 6637568 && std::abs(c->duration_us - 2636.669) < 1e-6) quoted = c;
  }
  REQUIRE(quoted != nullptr);
  REQUIRE(quoted->bytes.has_value());
  CHECK(*quoted->bytes == doctest::Approx(6637568.0 * 4));
  // Five all-reduce buckets per step whose element counts add up to the model's parameter count:
  // 2049000 + 7875584 + 6563840 + 6637568 + 2431040 = 25,557,032 = ResNet-50's parameters (DDP reduces
  // every gradient once per step). Three profiled steps -> 3 x 25,557,032 elements.
  std::int64_t total = 0;
  for (auto* c : ar) total += c->in_nelems;
  CHECK(total == 3 * 25557032LL);
  // Every all-reduce was launched inside one of the three ProfilerStep#4..#6 annotations.
  REQUIRE(k.steps.size() == 3);
  CHECK(k.steps[0].name == "ProfilerStep#4");
  for (auto* c : ar) CHECK(c->step >= 0);
  // Measured all-reduce time, summed with Python over the kernel events: 46762.159 µs.
  double ar_time = 0;
  for (auto* c : ar) ar_time += c->duration_us;
  constexpr double kSumTol = 1e-6;
  CHECK(ar_time == doctest::Approx(46762.159).epsilon(kSumTol));
  // 3774 GPU events (kernel + gpu_memcpy + gpu_memset); their durations sum to 165185.838 µs.
  CHECK(k.kernels.size() == 3774);
  double all = 0;
  for (const auto& t : k.totals) all += t.total_us;
  CHECK(all == doctest::Approx(165185.838).epsilon(kSumTol));
  // The steps' mean host time: (222442.191 + 219726.905 + 224936.243) / 3 = 222368.446 µs.
  CHECK(k.step_time_us() == doctest::Approx(222368.446).epsilon(kSumTol));
  CHECK(k.exposed_comm_us <= k.comm_us);
  CHECK(k.totals[static_cast<int>(Category::conv)].count > 0);
  CHECK(k.totals[static_cast<int>(Category::memcpy)].count == 960);
}

TEST_CASE("older traces: NCCL kernels without collective args are counted, not guessed") {
  std::string path = kineto_file("trace_filter__sampled_rank-0.json.gz");
  REQUIRE_MESSAGE(!path.empty(), "../shared/traces/kineto/trace_filter__sampled_rank-0.json.gz is missing");
  KinetoTrace k = import_kineto(path);
  // README: 10 ncclKernel_SendRecv kernels, record_param_comms without collective args.
  CHECK(k.collectives.empty());
  CHECK(k.unattributed_nccl_kernels == 10);
  CHECK(k.totals[static_cast<int>(Category::nccl)].count == 10);
}

TEST_CASE("tessel compare: a PyTorch profiler trace gives the summary comparison") {
  std::string shared = test::shared_dir();
  auto k = std::filesystem::path(shared) / "traces" / "kineto" / "nccl_parser_config__nccl_data.json.gz";
  REQUIRE_MESSAGE(std::filesystem::exists(k), (k.string() + " is missing from ../shared"));
  std::string pa = test::temp_path("cli-sim.json");
  trace::write_chrome_trace(test::two_stage_trace(), pa);
  Run r = tessel_compare(pa + " " + k.string() + " --json");
  REQUIRE(r.rc == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["mode"] == "summary");
  CHECK(j["b"]["source"] == "pytorch profiler");
  CHECK(j["b"]["steps"] == 3);
  // 15 all-reduces and 6 broadcasts over 3 steps: 7 NCCL kernels per step.
  CHECK(j["b"]["categories"]["nccl"]["count"].get<double>() == doctest::Approx(7));

  // A multi-step Tessel trace against the profiler trace: its median step after the first (step 4, 144 µs,
  // as in the test below), not the span of all five.
  std::string run = test::temp_path("cli-run5.json");
  trace::write_chrome_trace(test::multi_step_trace({2.0, 1.0, 1.5, 1.2, 1.3}, 50), run);
  r = tessel_compare(run + " " + k.string() + " --json");
  REQUIRE(r.rc == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["a"]["steps"] == 5);
  CHECK(j["a"]["step_us"].get<double>() == doctest::Approx(144).epsilon(1e-12));
  CHECK(j["steps"]["a"]["compared"] == 4);
  CHECK(j["steps"]["b"]["count"] == 3);
}
