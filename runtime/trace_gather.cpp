#include "runtime/trace_gather.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "util/error.hpp"

namespace tessel::rt {

namespace {

// Tags on the world communicator, apart from the small pipeline tags and under MPI's guaranteed
// MPI_TAG_UB of 32767.
constexpr int kSizeTag = 32001, kDataTag = 32002;

class Writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    out.append(p, sizeof v);
  }
  void str(const std::string& s) {
    put<std::uint64_t>(s.size());
    out += s;
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  void need(std::uint64_t n) const {
    TESSEL_CHECK(n <= in_.size() - pos_, "trace encoding truncated at byte " << pos_ << " of " << in_.size());
  }
  const std::string& in_;
  std::size_t pos_ = 0;
};

// Byte count <-> two floats (bit copies, never used as numbers).
void send_bytes(Comm& c, const std::string& bytes, int peer) {
  std::uint64_t n = bytes.size();
  float head[2];
  std::memcpy(head, &n, sizeof n);
  c.send(head, 2, peer, kSizeTag);
  std::vector<float> body((n + sizeof(float) - 1) / sizeof(float), 0.0f);
  if (n) std::memcpy(body.data(), bytes.data(), n);
  c.send(body.data(), body.size(), peer, kDataTag);
}

std::string recv_bytes(Comm& c, int peer) {
  float head[2];
  c.recv(head, 2, peer, kSizeTag);
  std::uint64_t n = 0;
  std::memcpy(&n, head, sizeof n);
  std::vector<float> body((n + sizeof(float) - 1) / sizeof(float));
  c.recv(body.data(), body.size(), peer, kDataTag);
  std::string bytes(n, '\0');
  if (n) std::memcpy(bytes.data(), body.data(), n);
  return bytes;
}

}  // namespace

std::string encode_trace(const trace::Trace& t) {
  Writer w;
  w.put<std::uint64_t>(t.events.size());
  for (const auto& e : t.events) {
    w.put<std::int32_t>(e.rank);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(e.stream));
    w.str(e.name);
    w.str(e.op);
    for (int v : {e.stage, e.chunk, e.mb, e.layer_begin, e.layer_end}) w.put<std::int32_t>(v);
    for (double v : {e.start_us, e.dur_us, e.flops, e.bytes}) w.put<double>(v);
    w.put<std::int64_t>(e.flow_id);
    w.str(e.extra.is_null() ? std::string() : e.extra.dump());
  }
  w.put<std::uint64_t>(t.counters.size());
  for (const auto& c : t.counters) {
    w.put<std::int32_t>(c.rank);
    w.str(c.name);
    w.put<double>(c.ts_us);
    w.put<double>(c.value);
  }
  w.put<std::uint64_t>(t.process_names.size());
  for (const auto& [rank, name] : t.process_names) {
    w.put<std::int32_t>(rank);
    w.str(name);
  }
  return std::move(w.out);
}

trace::Trace decode_trace(const std::string& bytes) {
  Reader r(bytes);
  trace::Trace t;
  t.events.resize(r.get<std::uint64_t>());
  for (auto& e : t.events) {
    e.rank = r.get<std::int32_t>();
    e.stream = static_cast<trace::Stream>(r.get<std::uint8_t>());
    e.name = r.str();
    e.op = r.str();
    for (int* v : {&e.stage, &e.chunk, &e.mb, &e.layer_begin, &e.layer_end}) *v = r.get<std::int32_t>();
    for (double* v : {&e.start_us, &e.dur_us, &e.flops, &e.bytes}) *v = r.get<double>();
    e.flow_id = r.get<std::int64_t>();
    const std::string extra = r.str();
    if (!extra.empty()) e.extra = nlohmann::json::parse(extra);
  }
  t.counters.resize(r.get<std::uint64_t>());
  for (auto& c : t.counters) {
    c.rank = r.get<std::int32_t>();
    c.name = r.str();
    c.ts_us = r.get<double>();
    c.value = r.get<double>();
  }
  const auto names = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < names; ++i) {
    const int rank = r.get<std::int32_t>();
    t.process_names[rank] = r.str();
  }
  TESSEL_CHECK(r.done(), "trace encoding has trailing bytes");
  return t;
}

trace::Trace gather_trace(Comm& world, const trace::Trace& local) {
  if (world.rank() != 0) {
    send_bytes(world, encode_trace(local), 0);
    return {};
  }
  trace::Trace all = local;
  for (int peer = 1; peer < world.size(); ++peer) {
    trace::Trace part = decode_trace(recv_bytes(world, peer));
    all.events.insert(all.events.end(), part.events.begin(), part.events.end());
    all.counters.insert(all.counters.end(), part.counters.begin(), part.counters.end());
    all.process_names.insert(part.process_names.begin(), part.process_names.end());
  }
  return all;
}

Recorder::Clock::time_point shared_origin(Comm& world) {
  const Recorder::Clock::time_point mine = Recorder::Clock::now();
  if (world.size() == 1) return mine;
  char host[256] = {};
  (void)gethostname(host, sizeof host - 1);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the host name
  for (const char* c = host; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  // Two 24-bit parts (exact in a float) and their negations: after a max-reduction, max == -max(-x) means
  // every rank has the same parts.
  const float a = static_cast<float>(h & 0xffffff), b = static_cast<float>((h >> 24) & 0xffffff);
  float v[4] = {a, b, -a, -b};
  world.all_reduce(v, 4, ReduceOp::max);
  if (v[0] != -v[2] || v[1] != -v[3]) return mine;
  // Rank 0's clock in nanoseconds, as four 16-bit parts (each exact in a float).
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(mine.time_since_epoch()).count();
  float parts[4] = {};
  for (int k = 0; k < 4; ++k) parts[k] = static_cast<float>((static_cast<std::uint64_t>(ns) >> (16 * k)) & 0xffff);
  world.broadcast(parts, 4, 0);
  std::uint64_t t = 0;
  for (int k = 0; k < 4; ++k) t |= static_cast<std::uint64_t>(parts[k]) << (16 * k);
  return Recorder::Clock::time_point(
      std::chrono::duration_cast<Recorder::Clock::duration>(std::chrono::nanoseconds(static_cast<std::int64_t>(t))));
}

}  // namespace tessel::rt
