// A layout written as words, the form Layout::describe() prints: "tp8 pp8 dp16 vpp3 mbs1 interleaved
// selective sp zero1 layers=3,4x6,3" (full recompute as "full" or "full-block2"; a schedule by any of its
// registry names; PyTorch's interleaved micro-batch rule as "mb-rule=torch"; docs/layout.md). Each term at most once; an unknown word, a repeated term or a value out of range is an
// InputError naming the word. Read by `explore --explain`; parse_layout (sim/layout.hpp) reads the JSON form.
#pragma once

#include <string>
#include <vector>

#include "sim/layout.hpp"

namespace tessel {

// `text`: the words, or the path of a layout JSON file (a name containing ".json"), read by parse_layout.
// Fields no word gives keep Layout's defaults; global_batch is `global_batch`. Without a schedule word, pp > 1
// means interleaved when vppN is given and 1F1B otherwise; without vppN, the schedule's own chunk count (zbv
// and dualpipev 2, interleaved and looped-bfs 3, the rest 1), as estimate and simulate default it. `what`
// leads the messages ("--explain").
Layout parse_layout_words(const std::string& text, int global_batch, const std::string& what = "--explain");

// describe()'s run-length stage split: "3,4x6,3" is 3,4,4,4,4,4,4,3. `what` names the word in messages.
std::vector<int> parse_stage_layers(const std::string& text, const std::string& what);

}  // namespace tessel
