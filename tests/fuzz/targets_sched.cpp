// Fuzz targets for schedules: the PyTorch-compatible CSV (placement inferred, as `tessel schedule` reads a
// CSV without sidecar) and the JSON sidecar applied to a golden CSV. A parsed schedule goes to validate()
// — the validator is the consumer every other user of a foreign schedule relies on — and, when valid, to
// the unit-cost simulation; the canonical CSV must read back to the same schedule.
#include <optional>

#include "util/error.hpp"
#include "sim/schedule/schedule.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/fuzz/targets.hpp"

namespace tessel::fuzz {

namespace {
const std::string kOrigin = "fuzz-input.csv";

sched::CsvMeta meta_of(const sched::Schedule& s) {
  sched::CsvMeta m;
  m.num_ranks = s.num_ranks;
  m.num_stages = s.num_stages;
  m.num_microbatches = s.num_microbatches;
  m.stage_to_rank = s.stage_to_rank;
  m.generator = s.generator;
  return m;
}

void use_schedule(const sched::Schedule& s) {
  const std::string csv = sched::to_csv(s);
  const sched::Schedule back = sched::parse_csv(csv, "round-trip", meta_of(s));
  FUZZ_CHECK(sched::to_csv(back) == csv, "schedule CSV round trip changed the schedule");
  const auto meta = sched::parse_meta_json(sched::to_meta_json(s), "round-trip.meta.json");
  FUZZ_CHECK(meta.stage_to_rank == s.stage_to_rank, "sidecar round trip changed the placement");
  const sched::ValidationReport rep = sched::validate(s);
  if (!rep.ok()) return;
  const sched::SimResult r = sched::unit_cost_simulate(s, sched::Costs{});
  FUZZ_CHECK(r.makespan >= 0, "negative makespan for a valid schedule");
}

// tests/golden/schedules/1f1b_p4_m8.csv: the sidecar target applies its input to this schedule.
constexpr const char* kGolden1f1b =
    "0F0,0F1,0F2,0F3,0B0,0F4,0B1,0F5,0B2,0F6,0B3,0F7,0B4,0B5,0B6,0B7\n"
    "1F0,1F1,1F2,1B0,1F3,1B1,1F4,1B2,1F5,1B3,1F6,1B4,1F7,1B5,1B6,1B7\n"
    "2F0,2F1,2B0,2F2,2B1,2F3,2B2,2F4,2B3,2F5,2B4,2F6,2B5,2F7,2B6,2B7\n"
    "3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,3F4,3B4,3F5,3B5,3F6,3B6,3F7,3B7\n";
}  // namespace

void schedule_csv(std::string_view data) {
  use_schedule(sched::parse_csv(std::string(data), kOrigin, std::nullopt));
}

void schedule_meta(std::string_view data) {
  const sched::CsvMeta meta = sched::parse_meta_json(std::string(data), "fuzz-input.meta.json");
  use_schedule(sched::parse_csv(kGolden1f1b, "golden-1f1b.csv", meta));
}

}  // namespace tessel::fuzz
