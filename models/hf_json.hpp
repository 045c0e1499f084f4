// Internal to models/: reading a HuggingFace config.json, whose keys are foreign (no strict key set), shared
// by the dense importer (import_hf.cpp) and the mixture-of-experts families (import_hf_moe.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "models/model.hpp"

namespace tessel::detail {

// The first of `keys` that is given (present and not null), an integer in [min, max]; InputError naming the
// key, the value and the range otherwise, or every name when none is given.
inline std::int64_t need_int(const Json& j, const std::string& where, std::initializer_list<const char*> keys,
                             std::int64_t min, std::int64_t max) {
  for (const char* k : keys) {
    if (!j.contains(k) || j.at(k).is_null()) continue;
    const Json& v = j.at(k);
    if (!v.is_number_integer() || v.get<std::int64_t>() < min || v.get<std::int64_t>() > max)
      throw InputError(where + ": " + k + ": value " + json_brief(v) + " must be an integer in [" +
                       std::to_string(min) + ", " + std::to_string(max) + "]");
    return v.get<std::int64_t>();
  }
  std::string names;
  for (const char* k : keys) names += (names.empty() ? "" : " or ") + std::string(k);
  throw InputError(where + ": missing required key " + names);
}

inline bool given(const Json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

// The value of an optional key of the expected JSON type; InputError naming key, value and type otherwise.
inline std::optional<std::string> opt_string(const Json& j, const std::string& where, const char* key) {
  if (!given(j, key)) return std::nullopt;
  if (!j.at(key).is_string())
    throw InputError(where + ": " + key + ": value " + json_brief(j.at(key)) + " must be a string");
  return j.at(key).get<std::string>();
}

inline std::optional<bool> opt_bool(const Json& j, const std::string& where, const char* key) {
  if (!given(j, key)) return std::nullopt;
  if (!j.at(key).is_boolean())
    throw InputError(where + ": " + key + ": value " + json_brief(j.at(key)) + " must be true or false");
  return j.at(key).get<bool>();
}

// An optional number in [min, max] (a scaling factor, a loss coefficient).
inline std::optional<double> opt_double(const Json& j, const std::string& where, const char* key, double min, double max) {
  if (!given(j, key)) return std::nullopt;
  const Json& v = j.at(key);
  if (!v.is_number() || !(v.get<double>() >= min && v.get<double>() <= max)) {
    std::ostringstream os;
    os << where << ": " << key << ": value " << json_brief(v) << " must be a number in [" << min << ", " << max << "]";
    throw InputError(os.str());
  }
  return v.get<double>();
}

// The layers a config's sliding window applies to: its layer_types ("sliding_attention" / "full_attention",
// one per layer) when given, else the family's default, `sliding(i)` for layer i. InputError naming
// layer_types and the value otherwise.
template <class Default>
std::vector<int> hf_window_layers(const Json& j, const std::string& where, int layers, Default sliding) {
  std::vector<int> out;
  if (!given(j, "layer_types")) {
    for (int i = 0; i < layers; ++i)
      if (sliding(i)) out.push_back(i);
    return out;
  }
  const Json& t = j.at("layer_types");
  if (!t.is_array() || static_cast<std::int64_t>(t.size()) != layers)
    throw InputError(where + ": layer_types: value " + json_brief(t) + " must be an array of " + std::to_string(layers) +
                     " strings, one per layer (num_hidden_layers)");
  for (int i = 0; i < layers; ++i) {
    const Json& e = t[static_cast<std::size_t>(i)];
    if (e == "sliding_attention") out.push_back(i);
    else if (e != "full_attention")
      throw InputError(where + ": layer_types[" + std::to_string(i) + "]: value " + json_brief(e) +
                       " is not one of: sliding_attention, full_attention");
  }
  return out;
}

// The mixture-of-experts families import_hf_config reads (model_type), and what they add to the dense
// fields import_hf_config has set (hidden, heads, ffn, biases, norms): experts, router, shared experts,
// dense layers, MLA, MTP modules, windows and sinks, as each family's HF modelling class builds them.
bool is_hf_moe_family(std::string_view model_type);
void import_hf_moe(const Json& j, const std::string& where, std::string_view model_type, Model& m);

}  // namespace tessel::detail
