// Fuzz targets for the model formats: model JSON (with load_model's HF dispatch), HuggingFace config.json
// and a Megatron-LM command line. An accepted model goes to its consumers: the exact parameter counts (int64
// products of the parsed dimensions) and a JSON round trip.
#include <sstream>

#include "models/model.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/fuzz/targets.hpp"

namespace tessel::fuzz {

namespace {
const std::string kOrigin = "fuzz-input";

// The consumers of a model: exact parameter counts and the JSON writer.
void use_model(const Model& m) {
  FUZZ_CHECK(m.total_params() > 0, "accepted model has a non-positive parameter count");
  // Round trip: what we write we must read back to the same model.
  const Json j = model_to_json(m);
  FUZZ_CHECK(model_to_json(parse_model(j, "round-trip")) == j, "model JSON round trip changed the model");
}
}  // namespace

void model_json(std::string_view data) {
  const Json j = parse_json_text(std::string(data), kOrigin);
  // load_model's dispatch: a HuggingFace config is recognised by its keys.
  if (is_hf_config(j)) use_model(import_hf_config(j, kOrigin));
  else use_model(parse_model(j, kOrigin));
}

void hf_config(std::string_view data) {
  use_model(import_hf_config(parse_json_text(std::string(data), kOrigin), kOrigin));
}

// A Megatron launch line: arguments split on whitespace, as a shell would for an unquoted script line.
void megatron_args(std::string_view data) {
  std::vector<std::string> argv;
  std::istringstream in{std::string(data)};
  for (std::string a; in >> a;) argv.push_back(a);
  use_model(import_megatron_args(argv, kOrigin));
}

}  // namespace tessel::fuzz
