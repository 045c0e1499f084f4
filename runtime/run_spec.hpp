// What `tessel run` executes, on either runtime: the model and layout, how many steps with which seed and
// learning rate, the data, the trace, and the recovery checkpoints to write or resume. The CPU command's
// flags (tools/run_common.hpp) and the CUDA runtime's options (runtime/cuda/run_cuda.hpp) extend it.
#pragma once

#include <cstdint>
#include <string>

#include "models/model.hpp"
#include "sim/layout.hpp"

namespace tessel::rt {

struct RunSpec {
  Model model;
  Layout layout;
  int steps = 10;
  std::uint64_t seed = 1234;
  float lr = 1e-3f;
  std::string data_file;       // token file (runtime/init.hpp's TokenStream); empty: the synthetic stream
  std::string trace_path;      // empty: no trace
  int save_every = 0;          // > 0: a recovery checkpoint every N steps into checkpoint_dir
  std::string checkpoint_dir, resume;
  int start_step = 0;          // the resumed checkpoint's step (0: a fresh run); traces number steps from it + 1
};

}  // namespace tessel::rt
