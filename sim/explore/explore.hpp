// Explore: enumerate the layouts of a model on N GPUs, reject the impossible ones with a reason, score the
// rest with the analytical estimate (fast, all cores), re-score the best K with the event simulator, rank.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sim/estimate.hpp"
#include "sim/goodput.hpp"
#include "sim/stack.hpp"

namespace tessel::explore {

// enumerate()'s stage_layers for "the time-balanced split", which score_range resolves from the layout's
// layer cost (a layout holding it is no layout to lower or print).
inline constexpr int kBalancedSplit = -1;
inline bool is_balanced_marker(const Layout& l) { return l.stage_layers.size() == 1 && l.stage_layers[0] == kBalancedSplit; }

// The search space. Empty vectors mean "every sensible value" (see default_space()).
struct Space {
  std::vector<int> tp, pp, cp, vpp, mbs, zero;
  // Expert parallelism (MoE models only): ep sizes, and etp sizes where 0 stands for "as tp" (Megatron-Core's
  // default). A dense model takes ep 1 whatever is given.
  std::vector<int> ep, etp;
  // The MoE token dispatcher: 0 NCCL's all-to-all, 1 DeepEP (Layout::deepep), tried for layouts whose ep group
  // crosses NVLink domains (inside one the two cost alike). Default: both, or what --stack offers.
  std::vector<int> deepep;
  // The all-to-all overlap (Layout::a2a_overlap: 0 off, 1 on), tried where ep > 1 on the schedules it applies
  // to (Layout::a2a_overlap_fits: DualPipeV, interleaved, 1F1B at pp 1). Default: both, or off under a --stack
  // without it.
  std::vector<int> a2a_overlap;
  std::vector<sched::Kind> schedules;
  std::vector<Recompute> recompute;
  std::vector<int> sp;                 // 0, 1
  std::vector<int> recompute_layers;   // full recompute, block method: layers recomputed per stage (0 = all)
  bool max_tp_inside_node = true;      // tp <= GPUs per node, for the default tp values and the given ones alike
  bool uneven = true;                  // also try the time-balanced split for every pp and vpp
  Precision precision = Precision::bf16;
  AttentionImpl attention = AttentionImpl::flash;
  CrossEntropyImpl cross_entropy = CrossEntropyImpl::megatron;  // --cross-entropy (a stack's replaces it unless given)
  std::optional<Fp8Recipe> fp8_recipe;  // --fp8-recipe; absent: the stack's (delayed without one)
  std::optional<bool> fp8_param_gather;  // --fp8-param-gather / --no-...; absent: the stack's (off without one)
  std::optional<Unfused> unfused;       // --unfused; absent: the stack's (all fused without one)
  std::optional<FlashKernel> flash_kernel;  // --flash-kernel; absent: the stack's (cudnn without one)
  std::optional<double> fragmentation;  // --fragmentation; absent: the stack's (0 without one)
  // The state dtypes every layout keeps (--main-grads, --moments, --master-weights): given, not searched.
  StateDtypes state;
  // What the training software overlaps, set on every layout (Layout's defaults; validate's conventions turn
  // them off for the 2021-22 Megatron-LM rows and overlap the pipeline sends for later sources).
  bool overlap_grad_reduce = true, overlap_param_gather = true, overlap_p2p = false;
  // --tp-comm-overlap: every sequence-parallel layout overlaps its TP communication (off: Megatron's default).
  bool tp_comm_overlap = false;
  // --stack: only what it runs is enumerated (its schedules, recompute policies, ZeRO stages; no SP or CP
  // where it has none), every layout with its attention, overlaps and micro-batch rule (apply_stack), which
  // replace the fields above.
  std::optional<Stack> stack;
  // Also enumerate the micro-batch sizes whose micro_batch*dp does not divide the global batch (left out
  // normally: each would only be rejected by batch-divisibility). diagnose() counts them.
  bool keep_indivisible_batches = false;
};

// One scored layout.
struct Scored {
  Layout layout;
  double step_s = 0;            // the tier's step time (simulated when tier == "des")
  double analytical_step_s = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;    // model TFLOP/s per GPU
  double mfu = 0;               // attention counted full (Megatron-LM, PaLM)
  double mfu_causal = 0;        // attention counted causal (half of QK^T and AV)
  double bubble = 0;
  double imbalance = 0;         // stage_imbalance (sim/estimate.hpp): the slowest stage over the mean, less 1
  double exposed_comm_s = 0;    // PP + DP communication the busiest rank waits on (TP, CP: inside busy time)
  double peak_memory_bytes = 0; // busiest GPU
  int peak_rank = 0;
  double capacity_bytes = 0;
  std::string tier = "analytical";
  // The event simulator's peak (each rank's own chunks, not the closed form's average chunk) exceeds the GPU
  // less --min-headroom: ranked after every layout that fits, and said so.
  bool over_memory = false;
  // The time to train at the tier's step time, when the search was given the job (Options::job).
  std::optional<goodput::Plan> plan;
};

// What ranks the layouts: the step time, or the expected time to train the whole job under failures (the
// goodput-adjusted time: a layout with a larger checkpoint or a slower restart can lose to a slower step).
enum class Objective { step, time_to_train };

struct Rejection {
  std::string rule;
  std::string example;  // one message of this rule, for the table
  long long count = 0;
};

struct Result {
  std::vector<Scored> top;            // ranked best first, at most top_n
  std::vector<Scored> pareto;         // step time vs peak memory front (fitting layouts), by memory
  long long enumerated = 0;
  long long scored = 0;               // analytical tier, fitting memory
  long long simulated = 0;
  long long too_large = 0;            // sent to it but over its size limit: kept their analytical score
  std::vector<Rejection> rejected;    // by rule, most frequent first ("memory" among them)
  double smallest_peak = 0;           // the smallest peak memory seen among well-formed layouts
  std::string smallest_peak_layout;
};

// What the event simulator says of one layout.
struct SimScore {
  double step_s = 0;
  double bubble = 0;          // idle share of the step on the busiest rank
  double exposed_comm_s = 0;  // communication not hidden behind compute on that rank (TP inside compute)
  double peak_memory_bytes = 0;
};
using SimulateFn = std::function<SimScore(const Layout&)>;

// The adaptive simulated tier re-scores at most this many layouts (each simulation of a large layout takes
// tens of milliseconds to seconds: --top 100000 once simulated 200,000 layouts for 505 s); --simulate-k
// asks for more.
constexpr int kMaxSimulated = 512;

struct Options {
  int top_n = 10;
  // 0: adaptive (grow until the top N is stable), up to kMaxSimulated; rows ranked past the simulated ones
  // keep their analytical scores (their tier says so).
  int simulate_k = 0;
  int threads = 0;          // 0: all cores
  SimulateFn simulate;      // empty: analytical tier only
  std::optional<goodput::Job> job;  // the job to train: every fitting layout gets its time to train (Scored::plan)
  Objective objective = Objective::step;  // time_to_train needs `job`
  // Called from the main thread while a phase runs: its name ("scoring", "simulating") and the fraction done.
  std::function<void(const char* phase, double fraction)> progress;
};

// tp_inside_node: tp up to the GPUs of one node (the default), else up to 64.
Space default_space(const Model& m, const System& sys, int gpus, bool tp_inside_node = true);
// All layouts of the space for this model, GPU count and global batch (dp derived). A layout whose split is
// to be balanced holds the kBalancedSplit marker (is_balanced_marker), which run() resolves when it scores it.
std::vector<Layout> enumerate(const Model& m, const System& sys, int gpus, int global_batch, const Space& space);
Result run(const Model& m, const System& sys, int gpus, int global_batch, const Space& space, const Options& opt);

// When nothing fits: for each layout rule, how many layouts of the space (with the micro-batch sizes the
// batch does not divide) it rejects first, and how many break it and no other rule: the nearest misses,
// which lifting that one rule alone would leave to the memory check. Most "only" first.
struct RuleCount {
  std::string rule;
  long long first = 0;     // layouts whose first broken rule this is
  long long only = 0;      // layouts that break this rule and no other
  std::string example;     // one of the `only` layouts (describe()) and its message; else one of `first`
};
std::vector<RuleCount> diagnose(const Model& m, const System& sys, int gpus, int global_batch, const Space& space);

// The event-simulated tier as explore runs it: one DP replica with the other replicas' traffic on the shared
// links (engine::Fidelity::replica), no critical path; the busiest rank's (most busy time) idle share and
// exposed communication (sim/engine/simulate.hpp).
SimulateFn event_simulator(const Model& m, const System& sys);

// Why a search found nothing to rank (run()'s top is empty), for the message that says what to change.
struct NothingFits {
  // A given tp, pp or cp (in the order given) that does not divide the GPU count; filled only when nothing
  // could be enumerated.
  struct Indivisible {
    std::string dimension;  // "tp", "pp", "cp"
    int size = 0;
  };
  std::vector<Indivisible> indivisible;
  // diagnose(): the layout rules that block, nearest misses first.
  std::vector<RuleCount> rules;
  // The restricted dimension ("tp", "pp", "cp", "vpp", "mbs", "zero", "schedule", "recompute" or "sp": a
  // non-empty vector of the Space) whose restriction lifted alone lets the most layouts fit (analytical
  // tier), and how many then fit; empty dimension when no lift lets any fit. Ties: the first in that order.
  std::string lift;
  long long lift_fit = 0;
};
// `r` is run()'s result for the same arguments; `opt` its options (the lifts run the analytical tier only).
NothingFits why_nothing_fits(const Model& m, const System& sys, int gpus, int global_batch, const Space& space,
                             const Result& r, const Options& opt);

// A layout's analytical score (the analytical tier's row for it).
Scored scored_of(const Estimate& e);
// Why a layout that does not fit was rejected: "needs 97.3 GiB on pipeline rank 0 of 80.0 GiB (tp8 ...)".
std::string memory_message(const Estimate& e);

// Ranking rule (deterministic): step time, then peak memory, then fewer model-parallel GPUs (tp*pp*cp),
// then the layout's description in lexicographic order.
bool better(const Scored& a, const Scored& b);
// The same under an objective: time_to_train compares the expected wall time first (both need a plan).
bool better_by(const Scored& a, const Scored& b, Objective objective);

// Why a layout ranks where it does or was rejected, and what would make it fit (text, several lines).
std::string explain(const Model& m, const System& sys, int gpus, const Layout& l, const Result& r);
// The same explanation as data (`explore --explain L --json`): verdict (rejected | fits | ranked | below_top),
// the rejection's rule and message with single changes that would fit, memory terms, the step's terms, the rank
// and the best layout's terms beside them.
Json explain_json(const Model& m, const System& sys, int gpus, const Layout& l, const Result& r);

Json scored_to_json(const Scored& s);
Json result_to_json(const Result& r);

}  // namespace tessel::explore
