// PyTorch's own schedule CSVs in ../shared/schedules/pytorch (from its test suite). Linked with
// tests/shared_main.cpp: without ../shared the executable exits 77 (skipped); with it, a missing file fails.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "sched_test_util.hpp"
#include "sim/schedule/diff.hpp"
#include "tests/test_paths.hpp"
#include "util/error.hpp"

using namespace tessel::sched;
using tessel::InputError;
using tessel::test::params;
using tessel::test::violations_text;

TEST_CASE("PyTorch's own schedule CSVs load, validate and match Tessel's generators") {
  const std::string shared = tessel::test::shared_dir();
  const std::string dir = shared + "/schedules/pytorch/";
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "dualpipev_4rank_10mb.csv"), (dir + " is missing from ../shared"));
  // test_schedule.py TestScheduleCsv.test_csv_compare: DualPipeV, 4 ranks, 10 mb. No sidecar: placement
  // is inferred (rank r computes stages r and 7 - r, V style).
  const Schedule dpv = read_csv(dir + "dualpipev_4rank_10mb.csv");
  CHECK(dpv.stage_to_rank == stage_to_rank(4, 8, Placement::V));
  for (CommModel m : {CommModel::Eager, CommModel::Blocking, CommModel::Batched})
    CHECK_MESSAGE(validate(dpv, {m, {}, 5}).ok(), violations_text(validate(dpv, {m, {}, 5})));
  CHECK(diff(dpv, generate("dualpipev", params(4, 10, 2))).empty());
  CHECK(validate(lower(dpv)).ok());

  // zb1p compute CSV in the older dialect (B = input grad): equals Tessel's zb1p (PyTorch's
  // ScheduleInterleavedZeroBubble) for p = 2, v = 2, m = 8.
  CHECK_THROWS_WITH_AS(read_csv(dir + "zb1p_2rank_2stagep_comms.csv"), doctest::Contains("'2BW0'"), InputError);
  const Schedule compute = read_csv(dir + "zb1p_2rank_2stagep_compute.csv", true);
  CHECK(compute.stage_to_rank == std::vector<int>{0, 1, 0, 1});
  CHECK(validate(compute).ok());
  CHECK(diff(compute, generate("zb1p", params(2, 8, 2))).empty());
  // The lowered artifact (PyTorch _merge_bw + _add_send_recv) is valid under all three comm models, and
  // re-lowering its compute order with Tessel gives a valid schedule as well.
  const Schedule comms = read_csv(dir + "zb1p_2rank_2stagep_comms.csv", true);
  for (CommModel m : {CommModel::Eager, CommModel::Blocking, CommModel::Batched})
    CHECK_MESSAGE(validate(comms, {m, {}, 5}).ok(), violations_text(validate(comms, {m, {}, 5})));
  CHECK(validate(lower(strip_comms(comms))).ok());
}
