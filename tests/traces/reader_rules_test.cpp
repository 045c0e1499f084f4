// The event reader's rules for both formats (traces/event_reader.hpp): repeated keys, X events without pid
// or tid, times beyond kMaxTraceTimeUs, negative durations, directories given as trace files.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "util/error.hpp"
#include "tests/traces/trace_fixtures.hpp"
#include "traces/chrome.hpp"
#include "traces/event_reader.hpp"
#include "traces/kineto.hpp"

using namespace tessel;
using namespace tessel::trace;

namespace {

std::string tessel_error(const std::string& text) {
  try {
    parse_chrome_trace(text, "t.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string kineto_error(const std::string& text) {
  try {
    kineto::parse_kineto(text, "k.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

// One Tessel op event with `fields` spliced in after its pid/tid/ts.
std::string op_event(const std::string& fields) {
  return R"({"ph":"X","name":"a","pid":0,"tid":0,"ts":0,)" + fields + R"(,"args":{"op":"forward"}})";
}

// A Kineto trace holding one kernel event with these fields.
std::string kineto_with(const std::string& kernel_fields) {
  return R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k",)" + kernel_fields + "}]}";
}

}  // namespace

TEST_CASE("a key repeated in one object is refused, with its path and the repeated value") {
  // QA's case: the second dur (999999) silently replaced the first and compare reported a +1762% step error.
  CHECK(tessel_error("[" + op_event(R"("dur":4665.437,"dur":999999.0)") + "]") ==
        "t.json: traceEvents[0]: dur (value 999999.0): duplicate key; each key may appear once in an object (a JSON "
        "reader keeps one of the values and drops the other without a word)");
  CHECK(tessel_error(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":1,"args":{"op":"forward","op":"backward"}}])")
            .find("t.json: traceEvents[0]: args.op (value \"backward\"): duplicate key") == 0);
  // A repeated container: named without a value.
  CHECK(tessel_error(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":1,"args":{"op":"forward"},"args":{}}])")
            .find("t.json: traceEvents[0]: args: duplicate key") == 0);
  // The event index counts events, not keys.
  CHECK(tessel_error("[" + op_event(R"("dur":1)") + "," + op_event(R"("dur":1,"name":"b")") + "]")
            .find("t.json: traceEvents[1]: name (value \"b\"): duplicate key") == 0);
  // Outside the events: otherData at any depth, inside arrays, and traceEvents itself.
  const std::string events = R"("traceEvents":[)" + op_event(R"("dur":1)") + "]";
  CHECK(tessel_error("{" + events + R"(,"otherData":{"model":"a","model":"b"}})").find("t.json: otherData.model (value \"b\"): duplicate key") == 0);
  CHECK(tessel_error("{" + events + R"(,"otherData":{"layout":{"tp":2,"pp":1,"tp":8}}})").find("t.json: otherData.layout.tp (value 8)") == 0);
  CHECK(tessel_error("{" + events + R"(,"otherData":{"x":[1,{"a":1,"a":2}]}})").find("t.json: otherData.x[1].a (value 2)") == 0);
  CHECK(tessel_error("{" + events + "," + events + "}").find("t.json: traceEvents: duplicate key") == 0);
  // The same format's other reader: Kineto traces.
  CHECK(kineto_error(kineto_with(R"("pid":0,"tid":7,"ts":0,"dur":1,"dur":2)")).find("k.json: traceEvents[0]: dur (value 2)") == 0);
  CHECK(kineto_error(R"({"schemaVersion":1,"schemaVersion":2,"traceEvents":[]})").find("k.json: schemaVersion (value 2): duplicate key") == 0);
}

TEST_CASE("keys that repeat only across objects are not duplicates, however many keys an object has") {
  // Each object has its own key set: the same keys in two events, in an event and its args, in sibling objects.
  const Trace t = parse_chrome_trace("[" + op_event(R"("dur":1)") + "," + op_event(R"("dur":2)") + "]", "t.json");
  CHECK(t.events.size() == 2);
  // 40 distinct keys (past the linear search's 32) read fine; a repeat among them is still found.
  std::string many;
  for (int i = 0; i < 40; ++i) many += ",\"k" + std::to_string(i) + "\":" + std::to_string(i);
  const std::string base = R"({"traceEvents":[)" + op_event(R"("dur":1)") + R"(],"otherData":{"a":0)";
  CHECK(parse_chrome_trace(base + many + "}}", "t.json").other_data.size() == 41);
  CHECK(tessel_error(base + many + R"(,"k3":9}})").find("t.json: otherData.k3 (value 9): duplicate key") == 0);
}

TEST_CASE("an X event needs its pid and tid in both formats") {
  // Without them the event landed on pid 0 / tid 0: rank 0's compute stream, or device 0.
  CHECK(tessel_error(R"([{"ph":"X","name":"a","tid":0,"ts":0,"dur":1,"args":{"op":"forward"}}])") ==
        "t.json: traceEvents[0]: X event 'a' without pid; every X event needs the pid and tid of its lane (Tessel "
        "traces: rank and stream; PyTorch profiler traces: device and stream)");
  CHECK(tessel_error(R"([{"ph":"X","name":"a","pid":0,"ts":0,"dur":1,"args":{"op":"forward"}}])")
            .find("traceEvents[0]: X event 'a' without tid") != std::string::npos);
  // libkineto writes pid (device) and tid (stream) on every X event (output_json.cpp, handleActivity).
  CHECK(kineto_error(kineto_with(R"("tid":7,"ts":0,"dur":1)")).find("k.json: traceEvents[0]: X event 'k' without pid") == 0);
  // Other phases are not required to carry them (Kineto's instant "Record Window End" has pid "").
  CHECK(kineto_error(R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":0,"dur":1},)"
                     R"({"ph":"i","name":"Record Window End","ts":5}]})") == "(accepted)");
}

TEST_CASE("times are bounded by 2^63 ns, durations are not negative") {
  // kMaxTraceTimeUs: int64 nanoseconds, the most a profiler records, is 9223372036854775807 ns.
  CHECK(kMaxTraceTimeUs == doctest::Approx(9223372036854775807.0 / 1000).epsilon(1e-15));
  // Today's Kineto epoch timestamps (~1.8e15 us) read; 1e300 (QA: a 300-digit "compute busy") does not.
  const kineto::KinetoTrace k = kineto::parse_kineto(kineto_with(R"("pid":0,"tid":7,"ts":1.8e15,"dur":2.5)"), "k.json");
  CHECK(k.kernels.at(0).start_us == 1.8e15);
  CHECK(kineto_error(kineto_with(R"("pid":0,"tid":7,"ts":0,"dur":1e300)")) ==
        "k.json: traceEvents[0]: dur 1e+300 is beyond +-9223372036854775.807 us (2^63 ns, the int64 nanoseconds "
        "profilers record); that is not a time a trace can hold");
  CHECK(kineto_error(kineto_with(R"("pid":0,"tid":7,"ts":-1e16,"dur":1)")).find("traceEvents[0]: ts -1e+16 is beyond") != std::string::npos);
  CHECK(tessel_error("[" + op_event(R"("dur":1e17)") + "]").find("traceEvents[0]: dur 1e+17 is beyond") != std::string::npos);
  // QA: a negative kernel duration was summarised with exit 0.
  CHECK(kineto_error(kineto_with(R"("pid":0,"tid":7,"ts":0,"dur":-4.5)")) ==
        "k.json: traceEvents[0]: negative dur -4.5; a duration is in [0, 9223372036854775.807 us (2^63 ns, the int64 "
        "nanoseconds profilers record)]");
  // A kernel or a ProfilerStep without its times would count as 0 us at time 0.
  CHECK(kineto_error(kineto_with(R"("pid":0,"tid":7,"ts":0)")) == "k.json: traceEvents[0]: kernel event 'k' without dur");
  CHECK(kineto_error(R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":0,"dur":1},)"
                     R"({"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,"dur":9}]})")
            .find("traceEvents[1]: user_annotation event 'ProfilerStep#1' without ts") != std::string::npos);
}

TEST_CASE("a trace without ProfilerStep annotations says what its step time is") {
  const kineto::KinetoTrace none = kineto::parse_kineto(
      R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":10,"dur":5},)"
      R"({"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":30,"dur":5}]})",
      "k.json");
  // Kernel span: first start 10 to last end 35.
  CHECK(none.step_time_us() == 25);
  CHECK(none.step_time_rule() ==
        "no ProfilerStep annotations; the step time is the kernel span (first kernel start to last kernel end)");
  const kineto::KinetoTrace two = kineto::parse_kineto(
      R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":10,"dur":5},)"
      R"({"ph":"X","cat":"cpu_op","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":20},)"
      R"({"ph":"X","cat":"cpu_op","name":"ProfilerStep#2","pid":1,"tid":1,"ts":20,"dur":40}]})",
      "k.json");
  CHECK(two.step_time_us() == 30);  // (20 + 40) / 2
  CHECK(two.step_time_rule() == "2 ProfilerStep(s), the step time is their mean host duration");
}

TEST_CASE("a directory given as a trace file is named as one") {
  // An ifstream opens a directory; its size read as 2^63 - 1 bytes, "over the trace size limit".
  const std::string dir = test::temp_path("a-directory.json");
  std::filesystem::create_directories(dir);
  CHECK_THROWS_WITH_AS(read_trace_bytes(dir), (dir + ": is a directory, not a file").c_str(), InputError);
  CHECK_THROWS_WITH_AS(read_chrome_trace(dir), (dir + ": is a directory, not a file").c_str(), InputError);
  CHECK_THROWS_WITH_AS(kineto::import_kineto(dir), (dir + ": is a directory, not a file").c_str(), InputError);
}
