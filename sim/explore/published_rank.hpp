// Where published layouts rank in explore's search: for each row of validate's schema that Tessel can model,
// explore runs on the row's model, system, GPU count and global batch, with the row's precision, attention and
// overlap conventions, exactly as validate maps the row (sim/validate.hpp: map_row), over the full space and
// over what the row's source software offered; the report gives the rank of the published layout in each.
//
// The published layout is the set of layouts validate builds for the row (its stated fields fixed, the null
// ones enumerated); its rank is that of the best of them that fits, by explore's ranking rule (analytical
// tier). A layout explore's enumeration does not hold (a micro-batch or chunk count outside its grid) is
// ranked where it would stand among the enumerated ones.
#pragma once

#include <string>
#include <vector>

#include "sim/explore/explore.hpp"
#include "sim/validate.hpp"

namespace tessel::explore {

// What a source's training software offered, as a restriction of explore's space (its pipeline schedules,
// recompute policies, sequence parallelism and optimizer sharding), with a short description.
struct SourceOptions {
  Space space;
  std::string what;  // "Megatron-LM 2021: schedules gpipe 1f1b interleaved; recompute none full; no SP; ZeRO 0"
};
// By the row id's source prefix, as validate's conventions are (sim/validate.cpp): Megatron-LM of
// Narayanan et al. 2021 (gpipe, 1F1B, interleaved; no selective recompute, no SP), of Korthikanti et al.
// 2022 (+ selective recompute and SP), the Zero Bubble fork (1F1B, interleaved, ZB-1P, ZB-2P), and the
// rest (NeMo: 1F1B, interleaved, and the distributed optimizer, ZeRO 1). ZeRO 3 where the row has it. What
// the row states of its own schedule, recompute, SP and ZeRO is added: its source ran it.
SourceOptions source_options(const std::string& row_id, const std::vector<RowCandidate>& published);

// The published layout's place in one search.
struct Standing {
  long long rank = 0;            // 1-based among the fitting layouts; 0: the published layout does not fit
  long long ranked = 0;          // fitting layouts of the space
  bool enumerated = true;        // explore's enumeration holds the published layout
  Scored published;              // its score (when rank > 0)
  Scored best;                   // the space's first (when ranked > 0)
  std::string why_not;           // rank 0: why (the memory it needs, or the rule it breaks)
};

struct PublishedRank {
  std::string id;
  std::string model;
  std::string system;
  int gpus = 0;
  int global_batch = 0;
  std::string published;         // validate's choice among the row's layouts (describe()): what it predicts
  Standing full;                 // over explore's whole space
  Standing source;               // within the source's options
  std::string source_options;    // SourceOptions::what
};

struct PublishedRanks {
  std::vector<PublishedRank> rows;
  std::vector<SkippedRow> skipped;  // rows validate cannot model, with its reason
};

// `rows` in validate's schema (`where` names the file); `system_override` as validate's --system; `threads`
// as explore's (0: all cores). Searches shared by several rows (same model, system, GPUs, batch, conventions
// and space) run once.
PublishedRanks rank_published(const Json& rows, const std::string& where, const System* system_override = nullptr,
                              int threads = 0);

Json published_ranks_to_json(const PublishedRanks& r);

}  // namespace tessel::explore
