// Pipeline schedule IR: the ordered actions of every pipeline rank. The simulator and the runtime execute
// exactly these per-rank lists, so this header is a stable contract.
//
// Vocabulary follows PyTorch torch.distributed.pipelining (see ../shared/reference/schedules.md):
// F forward, I input-grad backward, W weight-grad backward, B full backward (I+W fused).
// A stage is one model chunk; a rank holds `vpp` stages placed loop style (s % p) or V style.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::sched {

enum class ActionType {
  F,
  B,  // full backward: input grad and weight grad in one op
  I,  // input-grad backward (PyTorch "I", ZB "B")
  W,  // weight-grad backward
  RECOMPUTE,
  SEND_F,
  RECV_F,
  SEND_B,
  RECV_B,
  OVERLAP_F_B,  // DualPipe "F&B": sub-actions {F, B or I}, executed as one overlapped op
  REDUCE_GRAD,
  OPTIMIZER_STEP,
  UNSHARD,
  RESHARD,
  // PyTorch 2.15's lowered format: each SEND_x has one WAIT_SEND_x of the same stage and micro-batch later on
  // its rank (the send's buffer is retired there: it completes once the peer has posted the receive), and
  // each REDUCE_GRAD one WAIT_REDUCE_GRAD of the same stage, at most one reduction pending per rank.
  WAIT_SEND_F,
  WAIT_SEND_B,
  WAIT_REDUCE_GRAD,
};

// PyTorch token spelling ("F", "SEND_F", ...); RECOMPUTE and OPTIMIZER_STEP use the X_ extension prefix
// of the interchange proposal ("X_RECOMPUTE", "X_OPTIMIZER_STEP").
const char* type_name(ActionType t);
bool is_compute(ActionType t);  // F, B, I, W, RECOMPUTE, OVERLAP_F_B
bool is_comm(ActionType t);     // SEND_*, RECV_*
bool is_send(ActionType t);
bool is_recv(ActionType t);
bool is_wait(ActionType t);     // WAIT_SEND_F, WAIT_SEND_B, WAIT_REDUCE_GRAD
bool is_wait_send(ActionType t);
ActionType send_of_wait(ActionType wait);  // WAIT_SEND_F -> SEND_F, WAIT_SEND_B -> SEND_B

struct Action {
  ActionType type = ActionType::F;
  int stage = 0;
  int mb = -1;                       // -1: the action has no micro-batch (REDUCE_GRAD, UNSHARD, ...)
  std::vector<Action> sub;           // OVERLAP_F_B only: {F, B|I}, F first (canonical)
  int peer = -1;                     // SEND/RECV only: the other rank; -1 elsewhere

  // PyTorch token: "3F1", "2SEND_B0", "(0F7;7B3)OVERLAP_F_B", "1REDUCE_GRAD".
  std::string token() const;
  bool operator==(const Action& o) const;
};

Action make(ActionType t, int stage, int mb = -1);
Action make_overlap(const Action& f, const Action& b);

enum class Placement { Loop, V };

// Which software's micro-batch rule an interleaved schedule follows (sim/schedule/registry.hpp: the rules,
// group sizes and closed forms). Megatron-LM groups micro-batches by pp and needs m a multiple of pp;
// PyTorch's ScheduleInterleaved1F1B runs rounds = max(1, m // pp) groups of m / rounds micro-batches and needs
// only m divisible by its rounds. Where both accept m they build the same order.
enum class MicrobatchRule : std::uint8_t { megatron, torch };

struct Schedule {
  std::string generator;  // "1f1b", "csv", ...
  // An interleaved generator's micro-batch rule (its sidecar's generator.params.mb_rule); megatron elsewhere.
  MicrobatchRule rule = MicrobatchRule::megatron;
  int num_ranks = 0;      // pp
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<int> stage_to_rank;        // explicit, never inferred
  std::vector<std::vector<Action>> ranks;
  // Read from a CSV file: each action's cell (from 1) in its row, row r being line r + 1 of the file, so
  // messages point into the file (idle cells are skipped in `ranks` but counted here). Empty for generated
  // schedules; lower() and strip_comms() drop it (their positions are no longer the file's).
  std::vector<std::vector<int>> cells;

  int rank_of(int stage) const { return stage_to_rank.at(static_cast<std::size_t>(stage)); }
  std::vector<int> stages_of(int rank) const;  // ascending stage order
  int chunk_of(int stage) const;               // index of `stage` among stages_of(rank_of(stage))
  std::size_t num_actions() const;
};

// Loop: stage s on rank s % p. V: chunk c = s / p runs down (rank s % p) when c is even and back up
// (rank p-1-s%p) when odd; (p=4, 12 stages) -> 0123 3210 0123, as PyTorch generate_stage_to_rank_mapping.
std::vector<int> stage_to_rank(int pp, int num_stages, Placement placement);

// Per-stage costs in arbitrary time units. B here is the input-grad time (ZB's T_B); a full backward costs
// B + W. One value broadcasts to every stage. OVERLAP_F_B costs the sum of its parts (no overlap gain is
// assumed in unit-cost analysis). comm is the latency of one cross-rank transfer.
struct Costs {
  std::vector<double> F{1.0}, B{1.0}, W{1.0};
  double comm = 0.0;
  double f(int stage) const { return pick(F, stage); }
  double b(int stage) const { return pick(B, stage); }
  double w(int stage) const { return pick(W, stage); }
  double of(const Action& a) const;  // compute time of one action (comm ops: 0)

 private:
  static double pick(const std::vector<double>& v, int stage);
};

struct GenParams {
  int pp = 1;
  int microbatches = 1;
  int vpp = 1;                       // stages per rank
  std::optional<Costs> costs;        // zb-greedy / zb2p use them; others ignore them
  std::optional<int> mem_limit;      // max in-flight activations per rank (in stage-microbatch units)
  std::optional<int> group_size;     // interleaved, Megatron's rule: microbatch_group_size_per_vp_stage (default p)
  MicrobatchRule rule = MicrobatchRule::megatron;  // interleaved only
  // 1F1B (pp 1) and interleaved (vpp > 1) only: Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-
  // comm): each steady-state forward and the backward after it run as one F&B block (OVERLAP_F_B), so that
  // one's expert all-to-alls can hide under the other's compute; the warm-up takes one forward more (as
  // Megatron-Core's), so a block never pairs a micro-batch's forward with its own backward.
  bool combined = false;
};

enum class Kind : std::uint8_t;  // a schedule family (sim/schedule/registry.hpp)

// Builds a compute-only schedule. InputError naming the parameter and the rule for impossible parameters.
Schedule generate(Kind kind, const GenParams& params);
// The same by name or alias (sim/schedule/registry.hpp); an unknown name is an InputError listing the known.
Schedule generate(std::string_view name, const GenParams& params);

// Where lower() puts the comm ops.
enum class GapOrder {
  SendsFirst,  // just in time: sends right after their producer, recvs right before their consumer, every
               // send of a gap before its recvs. Runs exactly as the compute-only schedule under eager
               // comms; may deadlock under rendezvous (blocking or batched) comms
  Parity,      // just in time, each gap in Megatron p2p_communication._p2p_ops order: even ranks SEND_F
               // RECV_F SEND_B RECV_B, odd ranks RECV_F SEND_F RECV_B SEND_B (enough for 1F1B, not for
               // interleaved or V schedules)
  Auto,        // ZB reorder_communication: every comm op keyed by (its producer's end time in a unit-cost
               // eager simulation, transfer id), both sides of a transfer under one key, each op before the
               // first compute of its rank that starts at or after that time. Deadlock-free under all three
               // comm models whenever the compute order is valid; with free comms it runs under eager
               // exactly as the compute-only schedule. An invalid compute order is lowered SendsFirst
};

// Inserts SEND_x/RECV_x for adjacent stages on different ranks only (same-rank stages pass tensors
// locally) and never changes the order of the compute ops (checked). Input must be compute-only.
Schedule lower(const Schedule& compute_only, GapOrder order = GapOrder::Auto);
// Drops every SEND/RECV: the inverse of lower().
Schedule strip_comms(const Schedule& s);

// ---- validation --------------------------------------------------------------------------------------

enum class CommModel {
  Eager,     // a send never waits; a recv waits for its send (PyTorch _simulate_comms_compute)
  Blocking,  // a send waits until the peer posts the matching recv, one op at a time (rendezvous)
  Batched,   // consecutive comm ops between two computes post together (batch_isend_irecv; ZB runtime)
};
const char* comm_model_name(CommModel m);
CommModel parse_comm_model(const std::string& text);  // InputError naming the value and the choices

struct Violation {
  std::string rule;     // "structure", "completeness", "order", "causality", "fsdp", "send-recv", "wait", "deadlock", "memory"
  std::string message;  // names ranks, positions and tokens
  // The action it is about, where there is one (-1 otherwise: a missing action, a placement): its rank and
  // index in the rank's list (idle cells not counted), and for a schedule read from a file its line and cell.
  int rank = -1, index = -1, line = -1, cell = -1;
};

struct ValidationReport {
  std::vector<Violation> violations;
  // The checks run in phases, each only on a schedule that passed the ones before: "structure",
  // "completeness", "order" (FSDP, order, send/recv, memory) or "all" (the deadlock check too). Below "all",
  // fixing the violations listed may reveal others.
  std::string checked = "all";
  std::vector<int> peak_inflight;  // per rank: max live activations (F until B, or until W when split)
  bool ok() const { return violations.empty(); }
};

struct ValidateOptions {
  CommModel comm = CommModel::Eager;
  std::optional<int> mem_limit;   // per rank, in activations
  std::size_t max_violations = 50;
};

ValidationReport validate(const Schedule& s, const ValidateOptions& opt = {});

// ---- unit-cost simulation ----------------------------------------------------------------------------

struct Timed {
  double start = 0, end = 0;
};

struct SimResult {
  double makespan = 0;
  std::vector<double> busy;         // per rank: summed compute time
  std::vector<double> bubble;       // per rank: makespan - busy
  std::vector<double> first_start;  // per rank: start of its first compute
  std::vector<double> last_end;     // per rank: end of its last compute
  double bubble_rate = 0;           // mean over ranks of bubble / makespan
  // ZB paper definition (arXiv:2401.10241, formulas.md): (span - work) / span of the busiest-span rank,
  // span = last_end - first_start; startup skew of late ranks is not counted.
  double span_bubble_rate = 0;
  std::vector<std::vector<Timed>> times;  // per rank, per action, aligned with Schedule::ranks
};

// Earliest-start timing of the schedule: each rank runs its list in order, each op starts when its rank is
// free and its inputs (or, in a lowered schedule, its recvs) are ready. Runs validate() first and throws
// InputError with its first violation (a deadlock under `comm` names the cycle).
SimResult unit_cost_simulate(const Schedule& s, const Costs& costs, CommModel comm = CommModel::Eager);
// For a caller that already ran validate(s) with this comm model and got ok(): skips that second pass
// (about half the cost). A schedule that was not valid is an internal error (TESSEL_CHECK), not InputError.
SimResult unit_cost_simulate_validated(const Schedule& s, const Costs& costs, CommModel comm = CommModel::Eager);

// ---- CSV / JSON I/O ----------------------------------------------------------------------------------

// Parses one token with a full match of the grammar `<stage><TYPE>[<mb>]` or `(<tok>;<tok>)OVERLAP_F_B`.
// `legacy_bw` reads the older PyTorch dialect (B = input grad, BW = full backward).
Action parse_token(const std::string& token, const std::string& where, bool legacy_bw = false);

struct CsvMeta {
  int num_ranks = 0, num_stages = 0, num_microbatches = 0;
  std::vector<int> stage_to_rank;
  std::string generator = "csv";
  MicrobatchRule rule = MicrobatchRule::megatron;  // generator.params.mb_rule ("megatron" when absent)
  bool legacy_bw = false;  // dialect "torch<2025:B=input,BW=full" (else "torch>=2025:I=input,B=full")
  bool dialect_declared = false;  // the sidecar has a "dialect" key (without one, --legacy-bw decides)
  std::string dialect;            // its value, when declared
  std::string level;       // "compute_only", "compute_comms", or "" when the sidecar does not say
};

// The sidecar's dialects. PyTorch 2.15 (its _dump_csv's default, compute_comms) retires every send with a
// WAIT_SEND_F/B and every REDUCE_GRAD with a WAIT_REDUCE_GRAD; the 2025 spelling has no waits (I = input
// grad, B = full backward); the older one spells B for the input grad and BW for the full backward. All three
// are read; waits are read in any of them.
inline constexpr const char* kDialect215 = "torch>=2.15:I=input,B=full,waits";
inline constexpr const char* kDialect = "torch>=2025:I=input,B=full";
inline constexpr const char* kLegacyDialect = "torch<2025:B=input,BW=full";

enum class Dialect { torch_2_15, torch_2025, torch_legacy };
// "torch-2.15", "torch-2025", "torch-legacy" (the names `tessel schedule gen --dialect` takes).
const char* dialect_name(Dialect d);
Dialect parse_dialect(const std::string& text, const std::string& what);  // InputError naming the choices
// The schedule as dialect `d` writes it: a lowered schedule gets PyTorch 2.15's send waits (each WAIT_SEND_F
// right after the backward of its stage and micro-batch on the sending rank, the other waits at the end of
// the rank's list, as torch.distributed.pipelining's _add_wait_send places them) unless it has waits already;
// the older dialects have no waits, so they are dropped. Compute-only schedules are returned as they are.
Schedule for_dialect(const Schedule& s, Dialect d);

// Reads a PyTorch-compatible CSV. Placement and sizes come from `name.meta.json` beside it when present,
// else from `meta`, else are inferred from the file (stage owner = the rank that computes it; micro-batches
// = 1 + the largest mb). Empty cells (idle steps) are dropped. The older dialect is read when `legacy_bw`
// is set or the sidecar declares it (InputError when the sidecar declares the current one and `legacy_bw`
// is set: `legacy_flag` names the flag that set it; a sidecar without "dialect" leaves it to the flag).
Schedule read_csv(const std::string& path, bool legacy_bw = false, const std::string& what = "",
                  const std::string& legacy_flag = "--legacy-bw");
// For a schedule that failed validate(): when it has W and B but no I and, read in the older dialect
// (B = input grad), the file at `path` validates under `opt`, a hint saying so; else "".
std::string legacy_bw_hint(const std::string& path, const Schedule& s, const ValidateOptions& opt);
Schedule parse_csv(const std::string& text, const std::string& origin, const std::optional<CsvMeta>& meta,
                   bool legacy_bw = false);
// Canonical CSV: one row per rank, no idles, LF line ends, OVERLAP sub-actions F first.
std::string to_csv(const Schedule& s, Dialect spelling = Dialect::torch_2_15);
// Sidecar `name.meta.json` (schema 1 of reference/schedules.md).
std::string to_meta_json(const Schedule& s, Dialect d = Dialect::torch_2_15);
CsvMeta parse_meta_json(const std::string& text, const std::string& origin);
std::string meta_path_for(const std::string& csv_path);  // "x.csv" -> "x.meta.json"

}  // namespace tessel::sched
