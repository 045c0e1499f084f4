#include <doctest/doctest.h>

#include <cmath>

#include "runtime/trainer.hpp"
#include "tests/runtime/runtime_test_util.hpp"

using namespace tessel;
using namespace tessel::test;

TEST_CASE("single rank: the first loss is near log(V) and training lowers it") {
  // Init std 0.02 makes logits ~0, so the first loss is close to log(32) = 3.4657 (within 1%); the synthetic
  // stream is learnable (runs counting up by 3), so 5 AdamW steps at lr 1e-3 must lower it.
  const Model m = micro_gpt();
  auto r = rt::train_threads(m, layout(1, 1, 1, "1f1b", 1, 4), rt::TrainOptions{}, 5);
  REQUIRE(r.steps.size() == 5u);
  for (const auto& s : r.steps) MESSAGE("step " << s.step << " loss " << s.loss << " gnorm " << s.grad_norm);
  CHECK(rel_err(r.steps[0].loss, std::log(32.0)) < 0.01);
  CHECK(r.steps[4].loss < r.steps[0].loss);
}
