// Collectives recorded in a PyTorch profiler (Kineto) trace against Tessel's communication model for the
// same sizes and group on the recorded GPU's system preset.
#pragma once

#include <string>
#include <vector>

#include "sim/system.hpp"
#include "traces/kineto.hpp"

namespace tessel::cmd {

struct CollectiveRow {
  std::string name;          // as recorded ("allreduce")
  double bytes = 0;          // buffer size as nccl-tests counts it
  int group_size = 0;
  double measured_us = 0;
  double predicted_us = 0;   // 0 when Tessel has no model for this collective
  double busbw_measured_GBps = 0;
};

// The system for a trace: `system_flag` when given, else the preset matching the trace's device name.
System system_for_trace(const trace::kineto::KinetoTrace& k, const std::string& system_flag);
std::vector<CollectiveRow> predict_collectives(const trace::kineto::KinetoTrace& k, const System& sys);
Json collectives_json(const std::vector<CollectiveRow>& rows, const System& sys);
std::string collectives_table(const std::vector<CollectiveRow>& rows, const System& sys);

}  // namespace tessel::cmd
