// The `tessel` command: parse the verb, call the library, map errors to exit codes: 0 success, 1 a check
// that failed (schedule validate: invalid; schedule diff: different; compare --max-error: over), 2 bad input
// or infeasible layout, 3 internal error (a bug in Tessel: a CI job can tell it from a failed check).
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "util/error.hpp"
#include "util/suggest.hpp"
#include "tools/commands.hpp"

namespace {

constexpr int kInternalError = 3;

struct Verb {
  const char* name;
  int (*fn)(const tessel::cmd::Args&);  // nullptr: the verb lives in tessel-run (forward_to_runtime)
  const char* help;
};

#ifdef TESSEL_WITH_RUNTIME
constexpr auto kRun = tessel::cmd::run;
constexpr auto kBench = tessel::cmd::bench;
#else
constexpr int (*kRun)(const tessel::cmd::Args&) = nullptr;
constexpr int (*kBench)(const tessel::cmd::Args&) = nullptr;
#endif

const Verb kVerbs[] = {
    {"estimate", tessel::cmd::estimate, "analytical step time, throughput and memory of one layout"},
    {"simulate", tessel::cmd::simulate, "discrete-event simulation of one layout: summary, trace, timeline"},
    {"explore", tessel::cmd::explore, "rank the layouts of a model on a cluster"},
    {"validate", tessel::cmd::validate, "predict published measurements and report the error"},
    {"schedule", tessel::cmd::schedule, "generate, validate, show and diff pipeline schedules"},
    {"run", kRun, "execute a layout for real (CPU threads, MPI, CUDA/NCCL)"},
    {"bench", kBench, "microbenchmarks: GEMM, memory bandwidth, collectives"},
    {"compare", tessel::cmd::compare, "align two traces op by op and report the differences"},
    {"calibrate", tessel::cmd::calibrate, "fit a hardware profile from benchmarks and traces"},
};

void print_usage(std::FILE* f) {
  std::fprintf(f, "usage: tessel <verb> [options]   (tessel <verb> --help for its options)\n\nverbs:\n");
  for (const auto& v : kVerbs) std::fprintf(f, "  %-10s %s\n", v.name, v.help);
}

// The planning binary has no runtime: `tessel run` and `tessel bench` become `tessel-run run ...`, the
// executable installed beside this one, with the same arguments, environment and exit code.
int forward_to_runtime(const std::string& verb, char** argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path runtime = self.parent_path() / "tessel-run";
  if (ec || !std::filesystem::exists(runtime, ec))
    throw tessel::InputError("tessel " + verb + ": runs in the runtime executable " + runtime.string() +
                             ", which is missing (it is built and installed beside tessel: ninja -C BUILD, meson install)");
  std::fflush(stdout);
  std::fflush(stderr);
  const std::string path = runtime.string();
  argv[0] = const_cast<char*>(path.c_str());
  ::execv(path.c_str(), argv);
  throw tessel::InputError("tessel " + verb + ": cannot start " + path + ": " + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  std::string verb = argv[1];
  if (verb == "--help" || verb == "-h" || verb == "help") {
    print_usage(stdout);
    return 0;
  }
  if (verb == "--version") {
    std::printf("tessel %s\n", TESSEL_VERSION);
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& v : kVerbs) {
    if (verb != v.name) continue;
    try {
      if (!v.fn) return forward_to_runtime(verb, argv);
      return v.fn(args);
    } catch (const tessel::InputError& e) {
      std::cout.flush();
      std::cerr << "tessel " << verb << ": error: " << e.what() << "\n";
      return 2;
    } catch (const tessel::InfeasibleLayout& e) {
      std::cout.flush();
      std::cerr << "tessel " << verb << ": infeasible layout: " << e.what() << "\n";
      return 2;
    } catch (const std::exception& e) {
      std::cout.flush();
      std::cerr << "tessel " << verb << ": internal error: " << e.what() << "\n";
      return kInternalError;
    } catch (...) {
      std::cout.flush();
      std::cerr << "tessel " << verb << ": internal error: an exception that is not a std::exception\n";
      return kInternalError;
    }
  }
  std::vector<std::string> names;
  for (const auto& v : kVerbs) names.emplace_back(v.name);
  std::fprintf(stderr, "tessel: unknown verb '%s'%s\n", verb.c_str(), tessel::did_you_mean(verb, names).c_str());
  print_usage(stderr);
  return 2;
}
