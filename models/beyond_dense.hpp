// Internal to models/: the Tessel model file's keys for what lies beyond the dense transformer (moe, mla,
// mtp_layers, sliding_window, window_layers, attention_sinks), read by parse_model and written by
// model_to_json.
#pragma once

#include "models/model.hpp"

namespace tessel::detail {

// Reads those keys of `o` into `m` (whose layers are already read); the rules between them are
// check_beyond_dense's, called once the whole model is read.
void parse_beyond_dense(JsonObject& o, Model& m);
// Writes them into `j`, only those a model has: a dense model's JSON is unchanged.
void beyond_dense_to_json(const Model& m, Json& j);

}  // namespace tessel::detail
