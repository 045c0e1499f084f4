// "Did you mean": the edit distance and when a suggestion is made.
#include <doctest/doctest.h>

#include "util/suggest.hpp"

using tessel::did_you_mean;
using tessel::edit_distance;

TEST_CASE("edit distance counts insertions, deletions, substitutions and adjacent swaps as one each") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("--sytem", "--system") == 1);      // one insertion
  CHECK(edit_distance("interleavd", "interleaved") == 1);
  CHECK(edit_distance("gne", "gen") == 1);                 // one swap (Levenshtein alone: 2)
  CHECK(edit_distance("kitten", "sitting") == 3);          // k->s, e->i, +g
  CHECK(edit_distance("estimte", "estimate") == 1);
}

TEST_CASE("a suggestion only for a near miss, the closest and first of equals") {
  CHECK(did_you_mean("--sytem", {"--model", "--system", "--gpus"}) == "; did you mean '--system'?");
  CHECK(did_you_mean("gne", {"gen", "validate", "show", "diff"}) == "; did you mean 'gen'?");
  // Short words match nothing (at most a third of the word's length may change): "zz" is not "pp".
  CHECK(did_you_mean("zz", {"pp", "tp"}).empty());
  // Far from everything: no suggestion rather than a wrong one.
  CHECK(did_you_mean("--frobnicate", {"--model", "--system"}).empty());
  // Equally close: the first listed.
  CHECK(did_you_mean("--tpp", {"--tp", "--pp"}) == "; did you mean '--tp'?");
}
