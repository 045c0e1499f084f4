#include "tests/fuzz/targets.hpp"

namespace tessel::fuzz {

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {
      {"model_json", model_json},
      {"hf_config", hf_config},
      {"megatron_args", megatron_args},
      {"system_json", system_json},
      {"layout_json", layout_json},
      {"stack_json", stack_json},
      {"validation_rows", validation_rows},
      {"bench_json", bench_json},
      {"schedule_csv", schedule_csv},
      {"schedule_meta", schedule_meta},
      {"chrome_trace", chrome_trace},
      {"kineto_trace", kineto_trace},
      {"trace_file", trace_file},
      {"checkpoint_manifest", checkpoint_manifest},
      {"checkpoint_shard", checkpoint_shard},
  };
  return t;
}

TargetFn find_target(std::string_view name) {
  for (const auto& t : targets())
    if (name == t.name) return t.fn;
  return nullptr;
}

}  // namespace tessel::fuzz
