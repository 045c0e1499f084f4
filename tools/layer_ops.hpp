// One transformer layer's ops as `--ops` prints them (estimate, simulate): kind, dtype, shape or bytes, time
// forward and backward, share of the layer; a MoE model's MoE and dense layers apart.
#pragma once

#include "models/model.hpp"
#include "sim/layout.hpp"
#include "sim/system.hpp"
#include "sim/workload.hpp"
#include "util/json_reader.hpp"

namespace tessel::cmd {

// The human tables, after what the verb printed.
void print_layer_ops(const Model& m, const Layout& l, const System& sys);
// {"layer_ops": [...], "dense_layer_ops": [...]} (the second for a MoE model with dense layers) into `j`.
void add_layer_ops_json(const Model& m, const Layout& l, const System& sys, Json& j);

}  // namespace tessel::cmd
