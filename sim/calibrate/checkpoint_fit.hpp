// The checkpoint path's bandwidth fitted from what `tessel run --json` measured of its recovery checkpoints
// (docs/goodput.md): the bytes every save wrote and every load read, and the seconds each took.
#pragma once

#include <string>
#include <vector>

#include "sim/system.hpp"

namespace tessel::calib {

struct CheckpointFit {
  int saves = 0, loads = 0;
  double save_bytes = 0, save_s = 0, load_bytes = 0, load_s = 0;  // summed over the documents
  double write_bw = 0, read_bw = 0;  // bytes/s: the sums' ratio; 0 without a save (a load)
};

// Reads each document's "checkpoints": {"saved": [{bytes, seconds}, ...], "resumed": {...} or null}. InputError
// naming the file and the key for a document without them, or with no save nor load at all.
CheckpointFit fit_checkpoints(const std::vector<std::string>& run_documents);

// The profile's storage object with the fitted node bandwidths (write from saves, read from loads; a side without
// measurements is kept). The base must have a storage object: InputError naming `origin` otherwise.
void apply_checkpoint_fit(System& profile, const CheckpointFit& fit, const std::string& origin);

// One sentence for the profile's "source": what was fitted from what.
std::string describe_checkpoint_fit(const CheckpointFit& fit, const std::string& origin);

}  // namespace tessel::calib
