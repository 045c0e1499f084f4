// Fuzz targets: one function per input format, shared by the libFuzzer executables (fuzz_entry.cpp) and by
// the normal regression test (regression_test.cpp), which replays the committed corpus and every input that
// once crashed a target.
//
// Contract of a target: it feeds the bytes to the parser exactly as the tool would (then to the first
// consumer that trusts the parsed value), and returns normally when the input is accepted or rejected with
// InputError / InfeasibleLayout. Anything else escaping it — another exception type (out_of_range,
// bad_alloc, json type_error, an InternalError from TESSEL_CHECK), a sanitizer report, a hang — is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::fuzz {

using TargetFn = void (*)(std::string_view data);

struct Target {
  const char* name;  // also the folder name under tests/fuzz/corpus and tests/fuzz/regressions
  TargetFn fn;
};

// Every target, in the order tools/fuzz_smoke.sh runs them.
const std::vector<Target>& targets();
// nullptr when there is no target of that name.
TargetFn find_target(std::string_view name);

// Runs `fn` on `data`, swallowing only the expected rejections (InputError, InfeasibleLayout).
void run_expecting_rejection_or_success(TargetFn fn, std::string_view data);

// Individual targets (targets_*.cpp).
void model_json(std::string_view data);
void hf_config(std::string_view data);
void megatron_args(std::string_view data);
void system_json(std::string_view data);
void layout_json(std::string_view data);
void stack_json(std::string_view data);
void validation_rows(std::string_view data);
void bench_json(std::string_view data);  // tessel bench --json, as calibrate reads it
void schedule_csv(std::string_view data);
void schedule_meta(std::string_view data);
void chrome_trace(std::string_view data);
void kineto_trace(std::string_view data);
void trace_file(std::string_view data);  // raw file bytes: gzip or plain, Chrome or Kineto
void checkpoint_manifest(std::string_view data);
void checkpoint_shard(std::string_view data);

// A private scratch folder for targets that must go through files (created once per process).
const std::string& scratch_dir();

}  // namespace tessel::fuzz
