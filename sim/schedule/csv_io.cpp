// PyTorch-compatible schedule CSV (row = rank, cell = token, empty cell = idle step) and the JSON sidecar
// of reference/schedules.md ("Interchange format proposal").
//
// Tokens are matched whole: `<stage><TYPE>[<mb>]` or `(<tok>;<tok>)OVERLAP_F_B`. PyTorch's regex uses a
// prefix match, so `2BW0` silently reads as `2B` there; here it is an error unless the caller asks for
// the older dialect (B = input grad, BW = full backward) explicitly.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <sstream>

#include "util/error.hpp"
#include "util/json_reader.hpp"
#include "sim/schedule/registry.hpp"
#include "sim/schedule/schedule.hpp"

namespace tessel::sched {

namespace {

const std::map<std::string, ActionType>& type_table() {
  static const std::map<std::string, ActionType> t = {
      {"F", ActionType::F},           {"B", ActionType::B},
      {"I", ActionType::I},           {"W", ActionType::W},
      {"SEND_F", ActionType::SEND_F}, {"RECV_F", ActionType::RECV_F},
      {"SEND_B", ActionType::SEND_B}, {"RECV_B", ActionType::RECV_B},
      {"UNSHARD", ActionType::UNSHARD}, {"RESHARD", ActionType::RESHARD},
      {"REDUCE_GRAD", ActionType::REDUCE_GRAD}, {"X_RECOMPUTE", ActionType::RECOMPUTE},
      {"X_OPTIMIZER_STEP", ActionType::OPTIMIZER_STEP}, {"WAIT_SEND_F", ActionType::WAIT_SEND_F},
      {"WAIT_SEND_B", ActionType::WAIT_SEND_B}, {"WAIT_REDUCE_GRAD", ActionType::WAIT_REDUCE_GRAD}};
  return t;
}

// Text from the file as a message shows it: bytes outside printable ASCII as \xNN (a binary file's bytes
// would otherwise reach the terminal raw), at most kShown characters of it.
std::string shown(const std::string& text) {
  constexpr std::size_t kShown = 40;
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= kShown) return out + "... (" + std::to_string(text.size()) + " bytes)";
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

[[noreturn]] void bad_token(const std::string& tok, const std::string& where, const std::string& why) {
  throw InputError(where + ": token '" + shown(tok) + "': " + why +
                   " (grammar: <stage><TYPE>[<mb>] with TYPE in F I B W SEND_F RECV_F SEND_B RECV_B UNSHARD RESHARD "
                   "REDUCE_GRAD WAIT_SEND_F WAIT_SEND_B WAIT_REDUCE_GRAD X_RECOMPUTE X_OPTIMIZER_STEP, or (<tok>;<tok>)OVERLAP_F_B; "
                   "the whole cell must match)");
}

int parse_uint(const std::string& digits, const std::string& tok, const std::string& where) {
  if (digits.size() > 9) bad_token(tok, where, "index too large");
  return std::stoi(digits);
}

Action parse_simple(const std::string& tok, const std::string& where, bool legacy_bw) {
  std::size_t i = 0;
  while (i < tok.size() && std::isdigit(static_cast<unsigned char>(tok[i]))) ++i;
  if (i == 0) bad_token(tok, where, "must start with a stage index");
  std::size_t j = i;
  while (j < tok.size() && (std::isupper(static_cast<unsigned char>(tok[j])) || tok[j] == '_')) ++j;
  std::size_t k = j;
  while (k < tok.size() && std::isdigit(static_cast<unsigned char>(tok[k]))) ++k;
  if (k != tok.size()) bad_token(tok, where, "unexpected character '" + shown(std::string(1, tok[k])) + "'");
  std::string type = tok.substr(i, j - i);
  if (legacy_bw && type == "BW") type = "B";
  else if (legacy_bw && type == "B") type = "I";
  auto it = type_table().find(type);
  if (it == type_table().end())
    bad_token(tok, where, "unknown action type '" + type + "'" +
                              (type == "BW" ? " (older PyTorch dialect: BW = full backward, B = input grad; read it "
                                              "with --legacy-bw)"
                                            : ""));
  Action a = make(it->second, parse_uint(tok.substr(0, i), tok, where));
  if (k > j) a.mb = parse_uint(tok.substr(j), tok, where);
  const bool per_mb = is_compute(a.type) || is_comm(a.type) || is_wait_send(a.type);
  if (per_mb && a.mb < 0) bad_token(tok, where, type + " needs a micro-batch index");
  if (!per_mb && a.mb >= 0)
    bad_token(tok, where, type + " takes no micro-batch index (it acts on the whole stage)");
  return a;
}

// The sidecar's limit on pp (parse_meta_json) holds for a file without one: each row is a rank.
constexpr int kMaxRankRows = 1 << 20;

std::string trim(const std::string& s) {
  std::size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

Action parse_token(const std::string& token, const std::string& where, bool legacy_bw) {
  const std::string suffix = ")OVERLAP_F_B";
  if (token.empty() || token[0] != '(') return parse_simple(token, where, legacy_bw);
  if (token.size() <= suffix.size() + 1 || token.compare(token.size() - suffix.size(), suffix.size(), suffix) != 0)
    bad_token(token, where, "a compound token must end in " + suffix);
  const std::string inner = token.substr(1, token.size() - 1 - suffix.size());
  const auto semi = inner.find(';');
  if (semi == std::string::npos || inner.find(';', semi + 1) != std::string::npos)
    bad_token(token, where, "OVERLAP_F_B needs exactly two sub-actions separated by ';'");
  Action a = parse_simple(inner.substr(0, semi), where, legacy_bw);
  Action b = parse_simple(inner.substr(semi + 1), where, legacy_bw);
  if (a.type != ActionType::F) std::swap(a, b);  // canonical: F first
  if (a.type != ActionType::F || (b.type != ActionType::B && b.type != ActionType::I))
    bad_token(token, where, "OVERLAP_F_B pairs one F with one B or I");
  return make_overlap(a, b);
}

std::string meta_path_for(const std::string& csv_path) {
  std::filesystem::path p(csv_path);
  return (p.parent_path() / (p.stem().string() + ".meta.json")).string();
}

namespace {

// Sizes and placement from the file itself: a stage lives where it is computed.
CsvMeta infer_meta(const std::vector<std::vector<Action>>& ranks, const std::string& origin) {
  CsvMeta m;
  m.num_ranks = static_cast<int>(ranks.size());
  std::map<int, int> owner;
  int max_mb = -1, max_stage = -1;
  auto note = [&](const Action& a, int r) {
    max_mb = std::max(max_mb, a.mb);
    max_stage = std::max(max_stage, a.stage);
    if (!is_compute(a.type)) return;
    auto [it, fresh] = owner.emplace(a.stage, r);
    if (!fresh && it->second != r)
      throw InputError(origin + ": stage " + std::to_string(a.stage) + " is computed on ranks " +
                       std::to_string(it->second) + " and " + std::to_string(r) +
                       "; give the placement in " + "a .meta.json sidecar");
  };
  for (int r = 0; r < m.num_ranks; ++r)
    for (const auto& a : ranks[r]) {
      if (a.type == ActionType::OVERLAP_F_B)
        for (const auto& s : a.sub) note(s, r);
      else
        note(a, r);
    }
  // The sidecar's limits (parse_meta_json) hold for inferred sizes too: consumers allocate per stage and
  // per micro-batch, and a 9-digit index must not become a billion-entry table.
  if (max_stage >= (1 << 20) || max_mb >= (1 << 24))
    throw InputError(origin + ": stage index " + std::to_string(max_stage) + " / micro-batch index " +
                     std::to_string(max_mb) + " exceed the limits 2^20 stages and 2^24 micro-batches");
  m.num_stages = max_stage + 1;
  m.num_microbatches = max_mb + 1;
  for (int s = 0; s < m.num_stages; ++s) {
    if (!owner.count(s))
      throw InputError(origin + ": stage " + std::to_string(s) + " is never computed, so its rank is unknown; give "
                       "the placement in a .meta.json sidecar");
    m.stage_to_rank.push_back(owner[s]);
  }
  return m;
}

void set_peers(Schedule& s) {
  for (auto& rank : s.ranks)
    for (auto& a : rank) {
      if (!is_comm(a.type)) continue;
      const int peer_stage = (a.type == ActionType::SEND_F || a.type == ActionType::RECV_B) ? a.stage + 1 : a.stage - 1;
      a.peer = (peer_stage >= 0 && peer_stage < s.num_stages) ? s.rank_of(peer_stage) : -1;
    }
}

}  // namespace

Schedule parse_csv(const std::string& text, const std::string& origin, const std::optional<CsvMeta>& meta,
                   bool legacy_bw) {
  std::vector<std::vector<Action>> ranks;
  std::vector<std::vector<int>> cells;
  // A UTF-8 byte order mark, as Windows editors write one: PyTorch reads its CSVs as utf-8-sig, which drops it.
  const std::string kBom = "\xEF\xBB\xBF";
  std::istringstream in(text.compare(0, kBom.size(), kBom) == 0 ? text.substr(kBom.size()) : text);
  std::string line;
  int row = 0, blank = 0;  // blank: the first blank line since the last rank row, 0 when none
  while (std::getline(in, line)) {
    ++row;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Row i is rank i, so a blank line between rows would shift every later row to the next rank (PyTorch's
    // csv.reader reads it as a rank without actions). Blank lines at the end, an editor's final newlines,
    // are ignored.
    if (trim(line).empty()) {
      if (blank == 0) blank = row;
      continue;
    }
    if (blank != 0)
      throw InputError(origin + ":" + std::to_string(blank) + ": blank line " +
                       (ranks.empty() ? std::string("before the first rank row")
                                      : "between rank rows " + std::to_string(ranks.size() - 1) + " and " +
                                            std::to_string(ranks.size())) +
                       "; row i is rank i, so a blank line would shift every later row to the next rank (only "
                       "trailing blank lines are ignored)");
    if (static_cast<int>(ranks.size()) >= kMaxRankRows)
      throw InputError(origin + ":" + std::to_string(row) + ": more than 2^20 rank rows (the limit on pp)");
    ranks.emplace_back();
    cells.emplace_back();
    std::size_t start = 0;
    int col = 0;
    while (start <= line.size()) {
      std::size_t end = line.find(',', start);
      if (end == std::string::npos) end = line.size();
      std::string cell = trim(line.substr(start, end - start));
      ++col;
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = cell.substr(1, cell.size() - 2);
      if (!cell.empty()) {
        ranks.back().push_back(parse_token(cell, origin + ":" + std::to_string(row) + ":" + std::to_string(col), legacy_bw));
        cells.back().push_back(col);
      }
      start = end + 1;
    }
  }
  if (ranks.empty()) throw InputError(origin + ": empty schedule (no rank rows)");
  const CsvMeta m = meta ? *meta : infer_meta(ranks, origin);
  // The sidecar's level says what the file holds: compute_only has no SEND/RECV, compute_comms is lowered
  // (with more than one rank it has some).
  if (!m.level.empty()) {
    bool comms = false;
    for (std::size_t r = 0; r < ranks.size() && !comms; ++r) {
      const auto it = std::find_if(ranks[r].begin(), ranks[r].end(), [](const Action& a) { return is_comm(a.type); });
      if (it == ranks[r].end()) continue;
      comms = true;
      const auto p = static_cast<std::size_t>(it - ranks[r].begin());
      if (m.level == "compute_only")
        throw InputError(origin + ":" + std::to_string(r + 1) + ":" + std::to_string(cells[r][p]) + ": '" + it->token() +
                         "' in a file whose sidecar says level compute_only (no SEND/RECV); a lowered file is compute_comms");
    }
    if (m.level == "compute_comms" && !comms && ranks.size() > 1)
      throw InputError(origin + ": the sidecar says level compute_comms (lowered), but the file has no SEND/RECV "
                       "for its " + std::to_string(ranks.size()) + " ranks; a file without them is compute_only");
  }
  if (static_cast<int>(ranks.size()) != m.num_ranks)
    throw InputError(origin + ": " + std::to_string(ranks.size()) + " rank rows, but the sidecar says pp = " +
                     std::to_string(m.num_ranks));
  Schedule s;
  s.generator = m.generator;
  s.rule = m.rule;
  s.num_ranks = m.num_ranks;
  s.num_stages = m.num_stages;
  s.num_microbatches = m.num_microbatches;
  s.stage_to_rank = m.stage_to_rank;
  s.ranks = std::move(ranks);
  s.cells = std::move(cells);
  set_peers(s);
  return s;
}

Schedule read_csv(const std::string& path, bool legacy_bw, const std::string& what, const std::string& legacy_flag) {
  const std::string text = read_text_file(path, what);
  std::optional<CsvMeta> meta;
  const std::string mp = meta_path_for(path);
  std::error_code ec;
  if (std::filesystem::exists(mp, ec)) meta = parse_meta_json(read_text_file(mp), mp);
  if (meta && meta->dialect_declared && legacy_bw && !meta->legacy_bw)
    throw InputError(legacy_flag + ": " + path + "'s sidecar " + mp + " declares dialect " + meta->dialect +
                     " (I = input grad, B = full backward); the older dialect is read only for files that are in it");
  Schedule s = parse_csv(text, path, meta, legacy_bw || (meta && meta->legacy_bw));
  // Messages and summaries name a schedule by its label: for a file that is its path (with the sidecar's
  // generator name when it gives one), not "csv".
  s.generator = meta && meta->generator != "csv" ? path + " (" + meta->generator + ")" : path;
  return s;
}

// A file with W (weight grad) and B but no I may be in PyTorch's older dialect, where B is the input grad
// (zb1p_2rank_2stagep_compute.csv): read as full backwards, its Ws have no I. The hint is given only when
// reading it that way makes it valid, not for a current-dialect file with a stray W.
std::string legacy_bw_hint(const std::string& path, const Schedule& s, const ValidateOptions& opt) {
  bool w = false, b = false, i = false;
  for (const auto& rank : s.ranks)
    for (const auto& a : rank)
      for (const auto& part : a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a}) {
        w = w || part.type == ActionType::W;
        b = b || part.type == ActionType::B;
        i = i || part.type == ActionType::I;
      }
  if (!w || !b || i) return "";
  try {
    ValidateOptions one = opt;
    one.max_violations = 1;
    if (!validate(read_csv(path, true), one).ok()) return "";
  } catch (const InputError&) {
    return "";
  }
  return "the file has W and B but no I, and it is valid in PyTorch's older dialect, where B is the input grad "
         "(and BW a full backward): read it that way with --legacy-bw";
}

namespace {

// A token in the older spelling: B is the input grad, BW the full backward.
std::string legacy_token(const Action& a) {
  if (a.type == ActionType::OVERLAP_F_B) return "(" + legacy_token(a.sub[0]) + ";" + legacy_token(a.sub[1]) + ")OVERLAP_F_B";
  if (a.type != ActionType::B && a.type != ActionType::I) return a.token();
  return std::to_string(a.stage) + (a.type == ActionType::B ? "BW" : "B") + std::to_string(a.mb);
}

}  // namespace

std::string to_csv(const Schedule& s, Dialect spelling) {
  std::string out;
  for (const auto& rank : s.ranks) {
    for (std::size_t i = 0; i < rank.size(); ++i) {
      if (i) out += ',';
      out += spelling == Dialect::torch_legacy ? legacy_token(rank[i]) : rank[i].token();
    }
    out += "\n";
  }
  return out;
}

const char* dialect_name(Dialect d) {
  switch (d) {
    case Dialect::torch_2_15: return "torch-2.15";
    case Dialect::torch_2025: return "torch-2025";
    case Dialect::torch_legacy: return "torch-legacy";
  }
  return "?";
}

Dialect parse_dialect(const std::string& text, const std::string& what) {
  for (Dialect d : {Dialect::torch_2_15, Dialect::torch_2025, Dialect::torch_legacy})
    if (text == dialect_name(d)) return d;
  throw InputError(what + " " + text + ": unknown dialect; choose one of torch-2.15 (PyTorch 2.15: waits after sends), "
                   "torch-2025 (I = input grad, B = full backward, no waits), torch-legacy (B = input grad, BW = full)");
}

Schedule for_dialect(const Schedule& s, Dialect d) {
  Schedule out = s;
  out.cells.clear();
  bool lowered = false, waits = false;
  for (const auto& r : s.ranks)
    for (const auto& a : r) {
      lowered = lowered || is_comm(a.type);
      waits = waits || is_wait(a.type);
    }
  if (d != Dialect::torch_2_15) {
    for (auto& r : out.ranks) std::erase_if(r, [](const Action& a) { return is_wait(a.type); });
    return out;
  }
  if (!lowered || waits) return out;
  for (auto& rank : out.ranks) {
    std::vector<Action> with;
    std::vector<Action> pending;  // sends not yet waited for, in the order they were issued
    for (const Action& a : rank) {
      with.push_back(a);
      if (is_send(a.type)) pending.push_back(a);
      for (const Action& part : a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a}) {
        if (part.type != ActionType::B && part.type != ActionType::I) continue;
        const auto it = std::find_if(pending.begin(), pending.end(), [&](const Action& x) {
          return x.type == ActionType::SEND_F && x.stage == part.stage && x.mb == part.mb;
        });
        if (it == pending.end()) continue;
        with.push_back(make(ActionType::WAIT_SEND_F, part.stage, part.mb));
        pending.erase(it);
      }
    }
    for (const Action& x : pending)
      with.push_back(make(x.type == ActionType::SEND_F ? ActionType::WAIT_SEND_F : ActionType::WAIT_SEND_B, x.stage, x.mb));
    rank = std::move(with);
  }
  return out;
}

std::string to_meta_json(const Schedule& s, Dialect d) {
  bool lowered = false;
  for (const auto& r : s.ranks)
    for (const auto& a : r) lowered = lowered || is_comm(a.type);
  Json j = Json::object();
  j["schema"] = 1;
  j["dialect"] = d == Dialect::torch_2_15 ? kDialect215 : (d == Dialect::torch_2025 ? kDialect : kLegacyDialect);
  j["level"] = lowered ? "compute_comms" : "compute_only";
  j["pp"] = s.num_ranks;
  j["num_stages"] = s.num_stages;
  j["num_microbatches"] = s.num_microbatches;
  j["stage_to_rank"] = s.stage_to_rank;
  Json params = Json::object();
  if (s.rule != MicrobatchRule::megatron) params["mb_rule"] = rule_name(s.rule);
  j["generator"] = {{"name", s.generator}, {"params", params}};
  return j.dump(1) + "\n";
}

CsvMeta parse_meta_json(const std::string& text, const std::string& origin) {
  const Json j = parse_json_text(text, origin);
  JsonObject o(j, origin);
  CsvMeta m;
  o.integer("schema", 1, 1);
  // null is "not given", as for every optional key (opt_string).
  if (const auto dialect = o.opt_string("dialect")) {
    const std::string& d = *dialect;
    if (d != kDialect215 && d != kDialect && d != kLegacyDialect)
      o.fail("dialect", "'" + d + "' is not one of \"" + kDialect215 + "\" (PyTorch 2.15: waits after sends), \"" +
                            kDialect + "\" (I = input grad, B = full backward) and \"" + kLegacyDialect +
                            "\" (PyTorch's older spelling: B = input grad, BW = full backward)");
    m.legacy_bw = d == kLegacyDialect;
    m.dialect_declared = true;
    m.dialect = d;
  }
  if (const auto level = o.opt_string("level")) {
    m.level = *level;
    if (m.level != "compute_only" && m.level != "compute_comms")
      o.fail("level", "'" + m.level + "' is not compute_only (F/I/B/W and their kin only) or compute_comms (lowered: "
                      "with SEND/RECV)");
  }
  for (const char* k : {"cost", "memory", "comm_model", "expect"}) o.ignore(k);  // documented, not used here
  m.num_ranks = static_cast<int>(o.integer("pp", 1, 1 << 20));
  m.num_stages = static_cast<int>(o.integer("num_stages", 1, 1 << 20));
  m.num_microbatches = static_cast<int>(o.integer("num_microbatches", 1, 1 << 24));
  for (double x : o.number_array("stage_to_rank", 0, m.num_ranks - 1)) {
    if (x != static_cast<int>(x)) o.fail("stage_to_rank", "entries must be integer ranks");
    m.stage_to_rank.push_back(static_cast<int>(x));
  }
  if (static_cast<int>(m.stage_to_rank.size()) != m.num_stages)
    o.fail("stage_to_rank", "needs num_stages = " + std::to_string(m.num_stages) + " entries");
  if (o.has("generator")) {
    JsonObject g = o.object("generator");
    m.generator = g.string("name");
    // The generator's parameters are a label, but for an interleaved order's micro-batch rule, which names
    // the schedule a layout plays it as (simulate --schedule-file).
    if (g.has("params") && !g.raw("params").is_null()) {
      JsonObject params = g.object("params");
      if (auto r = params.opt_string("mb_rule")) m.rule = parse_microbatch_rule(*r, origin + ": generator.params.mb_rule");
      // Its other keys stay labels: no finish().
    } else {
      g.ignore("params");
    }
    g.finish();
  } else {
    o.ignore("generator");  // absent or null
  }
  o.finish();
  return m;
}

}  // namespace tessel::sched
