// "Did you mean": the closest of a list of known names to a word that is none of them, for messages about
// unknown flags, verbs, presets and schedules.
#pragma once

#include <string>
#include <vector>

namespace tessel {

// Edit distance: insertions, deletions, substitutions and swaps of two adjacent characters, each 1.
std::size_t edit_distance(const std::string& a, const std::string& b);

// "; did you mean 'x'?" for the known name closest to `word` when it is close enough to be a typo (at most
// 2 edits, and at most a third of the word's length, so that short words are not matched to anything);
// "" otherwise. Ties go to the first in `known`.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& known);

// A name as compared without case and punctuation: "LLAMA2-70B" and "llama2 70b" are both "llama270b" (a
// published row's model name against the presets and recipes).
std::string folded_name(const std::string& name);

}  // namespace tessel
