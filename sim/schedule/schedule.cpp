// Schedule IR helpers: token spelling, placement, per-action costs.
#include "sim/schedule/schedule.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::sched {

const char* type_name(ActionType t) {
  switch (t) {
    case ActionType::F: return "F";
    case ActionType::B: return "B";
    case ActionType::I: return "I";
    case ActionType::W: return "W";
    case ActionType::RECOMPUTE: return "X_RECOMPUTE";
    case ActionType::SEND_F: return "SEND_F";
    case ActionType::RECV_F: return "RECV_F";
    case ActionType::SEND_B: return "SEND_B";
    case ActionType::RECV_B: return "RECV_B";
    case ActionType::OVERLAP_F_B: return "OVERLAP_F_B";
    case ActionType::REDUCE_GRAD: return "REDUCE_GRAD";
    case ActionType::OPTIMIZER_STEP: return "X_OPTIMIZER_STEP";
    case ActionType::UNSHARD: return "UNSHARD";
    case ActionType::RESHARD: return "RESHARD";
    case ActionType::WAIT_SEND_F: return "WAIT_SEND_F";
    case ActionType::WAIT_SEND_B: return "WAIT_SEND_B";
    case ActionType::WAIT_REDUCE_GRAD: return "WAIT_REDUCE_GRAD";
  }
  return "?";
}

bool is_compute(ActionType t) {
  return t == ActionType::F || t == ActionType::B || t == ActionType::I || t == ActionType::W ||
         t == ActionType::RECOMPUTE || t == ActionType::OVERLAP_F_B;
}
bool is_send(ActionType t) { return t == ActionType::SEND_F || t == ActionType::SEND_B; }
bool is_recv(ActionType t) { return t == ActionType::RECV_F || t == ActionType::RECV_B; }
bool is_comm(ActionType t) { return is_send(t) || is_recv(t); }
bool is_wait_send(ActionType t) { return t == ActionType::WAIT_SEND_F || t == ActionType::WAIT_SEND_B; }
bool is_wait(ActionType t) { return is_wait_send(t) || t == ActionType::WAIT_REDUCE_GRAD; }
ActionType send_of_wait(ActionType wait) {
  TESSEL_CHECK(is_wait_send(wait), "send_of_wait of " << type_name(wait));
  return wait == ActionType::WAIT_SEND_F ? ActionType::SEND_F : ActionType::SEND_B;
}

std::string Action::token() const {
  if (type == ActionType::OVERLAP_F_B) {
    std::string s = "(";
    for (std::size_t i = 0; i < sub.size(); ++i) {
      if (i) s += ';';
      s += sub[i].token();
    }
    return s + ")OVERLAP_F_B";
  }
  std::string s = std::to_string(stage) + type_name(type);
  if (mb >= 0) s += std::to_string(mb);
  return s;
}

bool Action::operator==(const Action& o) const {
  return type == o.type && stage == o.stage && mb == o.mb && sub == o.sub && peer == o.peer;
}

Action make(ActionType t, int stage, int mb) {
  Action a;
  a.type = t;
  a.stage = stage;
  a.mb = mb;
  return a;
}

Action make_overlap(const Action& f, const Action& b) {
  TESSEL_CHECK(f.type == ActionType::F && (b.type == ActionType::B || b.type == ActionType::I),
               "OVERLAP_F_B needs {F, B|I}, got " << f.token() << ", " << b.token());
  Action a;
  a.type = ActionType::OVERLAP_F_B;
  a.stage = f.stage;  // PyTorch keeps the first sub-action's stage; only the sub-actions matter
  a.sub = {f, b};
  return a;
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < num_stages; ++s)
    if (stage_to_rank[static_cast<std::size_t>(s)] == rank) out.push_back(s);
  return out;
}

int Schedule::chunk_of(int stage) const {
  auto local = stages_of(rank_of(stage));
  return static_cast<int>(std::find(local.begin(), local.end(), stage) - local.begin());
}

std::size_t Schedule::num_actions() const {
  std::size_t n = 0;
  for (const auto& r : ranks) n += r.size();
  return n;
}

std::vector<int> stage_to_rank(int pp, int num_stages, Placement placement) {
  TESSEL_CHECK(pp > 0 && num_stages > 0, "pp " << pp << ", stages " << num_stages);
  std::vector<int> out(static_cast<std::size_t>(num_stages));
  for (int s = 0; s < num_stages; ++s) {
    int pos = s % pp, chunk = s / pp;
    out[static_cast<std::size_t>(s)] = (placement == Placement::V && chunk % 2 == 1) ? pp - 1 - pos : pos;
  }
  return out;
}

double Costs::pick(const std::vector<double>& v, int stage) {
  TESSEL_CHECK(!v.empty(), "empty cost vector");
  if (v.size() == 1) return v[0];
  TESSEL_CHECK(stage >= 0 && static_cast<std::size_t>(stage) < v.size(), "no cost for stage " << stage);
  return v[static_cast<std::size_t>(stage)];
}

double Costs::of(const Action& a) const {
  switch (a.type) {
    case ActionType::F: return f(a.stage);
    case ActionType::RECOMPUTE: return f(a.stage);  // recompute replays the forward
    case ActionType::I: return b(a.stage);
    case ActionType::W: return w(a.stage);
    case ActionType::B: return b(a.stage) + w(a.stage);
    case ActionType::OVERLAP_F_B: {
      double t = 0;
      for (const auto& s : a.sub) t += of(s);
      return t;
    }
    default: return 0.0;
  }
}

const char* comm_model_name(CommModel m) {
  switch (m) {
    case CommModel::Eager: return "eager";
    case CommModel::Blocking: return "blocking";
    case CommModel::Batched: return "batched";
  }
  return "?";
}

CommModel parse_comm_model(const std::string& text) {
  if (text == "eager") return CommModel::Eager;
  if (text == "blocking") return CommModel::Blocking;
  if (text == "batched") return CommModel::Batched;
  throw InputError("--comm '" + text + "': must be one of eager, blocking, batched");
}

}  // namespace tessel::sched
