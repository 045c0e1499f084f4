// Layout words (sim/layout_words.hpp): describe()'s form read back, and the reader's rules.
#include <doctest/doctest.h>

#include <string>

#include "sim/explore/explore.hpp"
#include "sim/layout_words.hpp"
#include "sim/stage_split.hpp"

using namespace tessel;

namespace {
std::string error_of(const std::string& words, const std::string& what) {
  try {
    parse_layout_words(words, 64, what);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// explore prints describe() and `--explain` reads it back: a word read differently would explain another
// layout than the row. Every layout explore enumerates for Megatron 7.5B on 64 A100s (every schedule, vpp,
// recompute method, SP, ZeRO stage and uneven split of the default space) must come back field for field.
// With 30 layers instead of 36, so that uneven balanced splits (30 over 4..32 stages) are enumerated too.
TEST_CASE("layout words: every layout explore enumerates reads back from its describe()") {
  Model m = load_model("megatron-7.5b");
  m.layers = 30;
  const System sys = load_system("dgx-a100");
  const int gbs = 256;
  const std::vector<Layout> all = explore::enumerate(m, sys, 64, gbs, {});
  REQUIRE(all.size() > 1000);
  bool block = false, split = false, zbv = false;
  for (Layout l : all) {
    // A balanced split is resolved when explore scores the layout (a layout breaking a rule is never printed),
    // by the partitioner on the layer's time as here.
    if (explore::is_balanced_marker(l)) {
      l.stage_layers = even_split(m.layers, l.num_stages());
      if (layout_problem(l, m, 64)) continue;
      l.stage_layers = partition(partition_costs(m, l, sys, nullptr, false))->layers;
      drop_even_split(l, m.layers);
    }
    const std::string words = l.describe();
    CAPTURE(words);
    const Layout back = parse_layout_words(words, gbs);
    CHECK(layout_to_json(back) == layout_to_json(l));
    block = block || l.recompute_method == RecomputeMethod::block;
    split = split || !l.stage_layers.empty();
    zbv = zbv || l.schedule == sched::Kind::zbv;
  }
  // The forms that have words of their own were among them.
  CHECK(block);
  CHECK(split);
  CHECK(zbv);
}

TEST_CASE("layout words: defaults, and messages led by the caller's name") {
  // No schedule word: interleaved when vppN is given, else 1F1B; no vppN: the schedule's own count (zbv 2,
  // interleaved 3, 1f1b 1).
  CHECK(parse_layout_words("tp2 pp4 vpp2", 8).schedule == sched::Kind::interleaved);
  CHECK(parse_layout_words("tp2 pp4", 8).schedule == sched::Kind::one_f_one_b);
  CHECK(parse_layout_words("pp4 zbv", 8).vpp == 2);
  CHECK(parse_layout_words("pp4 interleaved", 8).vpp == 3);
  CHECK(parse_layout_words("pp4 1f1b", 8).vpp == 1);
  CHECK(parse_layout_words("pp4 1f1b", 8).global_batch == 8);
  CHECK(error_of("tp8 tp4", "--layout") == "--layout: 'tp4' gives the tp a second time (already 'tp8'); each layout term once");
  CHECK(error_of("tp8 zero4", "--explain") == "--explain zero4: 4 is out of range [0, 3]");
  CHECK(error_of("tp8 layers=3,,4", "--explain") ==
        "--explain layers=3,,4: an empty stage entry (give them as describe() prints them: 3,4x6,3)");
  CHECK(error_of("tpx", "--explain") == "--explain tpx: 'x' is not an integer");
  CHECK(error_of("tp8 warp9", "--explain").rfind("--explain: word 'warp9' is not a layout term", 0) == 0);
  CHECK(error_of("", "--explain").find("names no layout") != std::string::npos);
}

TEST_CASE("layout words: PyTorch's interleaved micro-batch rule is a word, in describe() and back") {
  // p 4, m 6 (global batch 6, dp 1, mbs 1): Megatron's rule refuses it, PyTorch's takes it.
  const Layout l = parse_layout_words("tp1 pp4 dp1 vpp2 mbs1 interleaved mb-rule=torch", 6);
  CHECK(l.microbatch_rule == sched::MicrobatchRule::torch);
  CHECK(l.describe() == "tp1 pp4 dp1 vpp2 mbs1 interleaved mb-rule=torch");
  CHECK(layout_to_json(l).at("microbatch_rule") == "torch");
  CHECK(parse_layout(layout_to_json(l), "json").microbatch_rule == sched::MicrobatchRule::torch);
  CHECK_FALSE(layout_problem(l, load_model("tiny"), 4));
  Layout megatron = l;
  megatron.microbatch_rule = sched::MicrobatchRule::megatron;
  REQUIRE(layout_problem(megatron, load_model("tiny"), 4));
  CHECK(layout_problem(megatron, load_model("tiny"), 4)->rule == "schedule-microbatches");
  // The default rule prints nothing and writes no key: the layouts of every earlier output read the same.
  CHECK(megatron.describe() == "tp1 pp4 dp1 vpp2 mbs1 interleaved");
  CHECK_FALSE(layout_to_json(megatron).contains("microbatch_rule"));
  CHECK(error_of("pp4 1f1b mb-rule=torch", "--layout") ==
        "--layout: 'mb-rule=torch' applies to interleaved only; schedule 1f1b has its own micro-batch rule");
  CHECK(error_of("pp4 mb-rule=pytorch", "--layout").rfind("--layout mb-rule=pytorch: unknown micro-batch rule", 0) == 0);
}

TEST_CASE("layout words: TP communication overlap is a word, in describe(), JSON and back; it needs sp") {
  Layout l = parse_layout_words("tp8 pp2 dp4 mbs1 1f1b sp tp-overlap", 64);
  CHECK(l.tp_comm_overlap);
  CHECK(l.sequence_parallel);
  CHECK(l.describe() == "tp8 pp2 dp4 mbs1 1f1b sp tp-overlap");
  const Layout back = parse_layout(layout_to_json(l), "json");
  CHECK(back.tp_comm_overlap);
  CHECK_FALSE(parse_layout_words("tp8 pp2 dp4 sp", 64).tp_comm_overlap);
  CHECK(error_of("tp8 tp-overlap tp-overlap", "--layout") ==
        "--layout: 'tp-overlap' gives the tp-overlap a second time (already 'tp-overlap'); each layout term once");
  // Megatron-LM asserts --sequence-parallel with --tp-comm-overlap: so does the layout check, by rule name.
  Layout no_sp = parse_layout_words("tp8 pp1 dp8 tp-overlap", 64);
  const auto problems = layout_problems(no_sp, load_model("gpt3-175b"), 64);
  REQUIRE_FALSE(problems.empty());
  CHECK(problems.front().rule == "tp-overlap-needs-sp");
}

TEST_CASE("layout words: state dtypes are words, in describe(), JSON and back; fp32 training refuses them") {
  Layout l = parse_layout_words("tp8 pp8 dp2 vpp12 mbs1 interleaved zero1 grads=bf16 moments=bf16 master=none", 32);
  CHECK(l.state.main_grads == StateDtype::bf16);
  CHECK(l.state.moments == StateDtype::bf16);
  CHECK(l.state.master_weights == MasterWeights::none);
  CHECK(l.describe() == "tp8 pp8 dp2 vpp12 mbs1 interleaved zero1 grads=bf16 moments=bf16 master=none");
  const Json j = layout_to_json(l);
  CHECK(j.at("main_grads") == "bf16");
  CHECK(j.at("moments") == "bf16");
  CHECK(j.at("master_weights") == "none");
  CHECK(layout_to_json(parse_layout(j, "json")) == j);
  // The defaults leave the words and keys out, so layouts written before them read and print as they did.
  const Layout plain = parse_layout_words("tp8 pp8 dp2 mbs1", 32);
  CHECK(plain.describe() == "tp8 pp8 dp2 mbs1 1f1b");
  CHECK_FALSE(layout_to_json(plain).contains("moments"));
  CHECK(parse_layout_words("tp1 master=remainder", 1).state.master_weights == MasterWeights::remainder);
  CHECK(error_of("tp1 moments=fp16", "--layout") == "--layout moments=fp16: value \"fp16\" is not one of fp32, bf16");
  CHECK(error_of("tp1 master=fp16", "--layout") ==
        "--layout master=fp16: value \"fp16\" is not one of fp32, remainder, none");
  Json bad = j;
  bad["moments"] = "fp8";
  CHECK_THROWS_WITH_AS(parse_layout(bad, "l.json"), "l.json: moments: value \"fp8\" is not one of fp32, bf16", InputError);
  const Model m = load_model("gpt3-175b");
  Layout fp32 = parse_layout_words("tp8 pp8 dp1 mbs1 moments=bf16", 64);
  fp32.precision = Precision::fp32;
  const auto p = layout_problems(fp32, m, 64);
  REQUIRE_FALSE(p.empty());
  CHECK(p.front().rule == "state-dtypes");
  Layout fp16 = parse_layout_words("tp8 pp8 dp1 mbs1 master=remainder", 64);
  fp16.precision = Precision::fp16;
  const auto q = layout_problems(fp16, m, 64);
  REQUIRE_FALSE(q.empty());
  CHECK(q.front().rule == "master-remainder");
  fp16.state.master_weights = MasterWeights::none;
  CHECK(layout_problems(fp16, m, 64).empty());
}
