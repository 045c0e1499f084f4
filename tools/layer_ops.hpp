// One transformer layer's ops as `--ops` prints them (estimate, simulate): kind, dtype, shape or bytes, time
// forward and backward, share of the layer; each kind of layer apart (sim/workload.hpp layer_kind).
#pragma once

#include "models/model.hpp"
#include "sim/layout.hpp"
#include "sim/system.hpp"
#include "sim/workload.hpp"
#include "util/json_reader.hpp"

namespace tessel::cmd {

// The --ops flag's help, estimate's and simulate's.
inline constexpr const char* kOpsHelp =
    "also show one layer's ops, each kind of layer apart (a MoE model's dense layers, windowed attention layers): "
    "kind, dtype, shape, time forward and backward, share";

// The human tables, after what the verb printed.
void print_layer_ops(const Model& m, const Layout& l, const System& sys);
// Each kind of layer the model has (sim/workload.hpp layer_kind) into `j` under its key: "layer_ops" (kind 0:
// every layer of a plain model, a MoE model's MoE layers with full attention), "dense_layer_ops" (a MoE model's
// dense layers), "window_layer_ops", "dense_window_layer_ops"; a kind the model lacks has no key.
void add_layer_ops_json(const Model& m, const Layout& l, const System& sys, Json& j);

}  // namespace tessel::cmd
