#include "traces/event_reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include "util/error.hpp"
#include "util/json_reader.hpp"

namespace tessel::trace {

namespace {

std::string read_file_bytes(const std::string& path) {
  refuse_directory(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open trace file for reading");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  // tellg is -1 when the file cannot seek (a pipe, a device): its size is unknown.
  if (end < 0) throw InputError(path + ": cannot determine the file's size (not a regular file)");
  auto size = static_cast<std::uint64_t>(end);
  if (size > kMaxTraceBytes) {
    throw InputError(path + ": " + std::to_string(size) + " bytes exceeds the trace size limit of " +
                     std::to_string(kMaxTraceBytes) + " bytes (Perfetto's 4 GB limit)");
  }
  in.seekg(0);
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (!in) throw InputError(path + ": read error");
  return bytes;
}

// RFC 1952: every gzip member starts with ID1 = 0x1f, ID2 = 0x8b.
bool is_gzip(const std::string& b) {
  return b.size() >= 2 && static_cast<unsigned char>(b[0]) == 0x1f && static_cast<unsigned char>(b[1]) == 0x8b;
}

std::string gunzip(const std::string& in, const std::string& path) {
  z_stream zs{};
  // 16 + MAX_WBITS: expect a gzip header (zlib manual, inflateInit2).
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw InputError(path + ": cannot initialise gzip decoder");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  std::string out;
  out.resize(std::max<std::size_t>(in.size() * 8, 1 << 16));
  std::size_t produced = 0;
  int rc = Z_OK;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= kMaxTraceBytes) {
        inflateEnd(&zs);
        throw InputError(path + ": inflates to more than the trace size limit of " +
                         std::to_string(kMaxTraceBytes) + " bytes (Perfetto's 4 GB limit)");
      }
      out.resize(std::min<std::uint64_t>(out.size() * 2, kMaxTraceBytes));
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = static_cast<uInt>(std::min<std::size_t>(out.size() - produced, 1u << 30));
    std::size_t before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    produced += before - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members are legal (RFC 1952 2.2); continue with the next one.
      if (zs.avail_in == 0) break;
      inflateReset(&zs);
      continue;
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) break;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;
  }
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    throw InputError(path + ": corrupt or truncated gzip data (zlib: " + (zs.msg ? zs.msg : "unexpected end") + ")");
  }
  out.resize(produced);
  return out;
}

// One JSON scalar as the SAX parser hands it over.
struct Val {
  enum Kind { null, boolean, integer, floating, string } kind;
  bool b = false;
  std::int64_t i = 0;
  double d = 0;
  const std::string* s = nullptr;
  bool is_number() const { return kind == integer || kind == floating; }
  double number() const { return kind == integer ? static_cast<double>(i) : d; }
  nlohmann::json to_json() const {
    switch (kind) {
      case null: return nullptr;
      case boolean: return b;
      case integer: return i;
      case floating: return d;
      case string: return *s;
    }
    return nullptr;
  }
  const char* kind_name() const {
    static const char* names[] = {"null", "boolean", "integer", "number", "string"};
    return names[kind];
  }
};

enum class Frame { top_object, events, event, args, layers, build, skip };

// kMaxTraceTimeUs as messages print it.
constexpr const char* kMaxTimeText = "9223372036854775.807 us (2^63 ns, the int64 nanoseconds profilers record)";

class Handler {
 public:
  Handler(const std::string& text, const std::string& origin, const EventSink& sink)
      : text_(text), origin_(origin), sink_(sink) {}

  TraceDocument doc;

  bool null() { return scalar(Val{Val::null}); }
  bool boolean(bool v) { Val x{Val::boolean}; x.b = v; return scalar(x); }
  bool number_integer(std::int64_t v) { Val x{Val::integer}; x.i = v; return scalar(x); }
  bool number_unsigned(std::uint64_t v) {
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      Val x{Val::floating}; x.d = static_cast<double>(v); return scalar(x);
    }
    Val x{Val::integer}; x.i = static_cast<std::int64_t>(v); return scalar(x);
  }
  bool number_float(double v, const std::string&) { Val x{Val::floating}; x.d = v; return scalar(x); }
  bool string(std::string& v) { Val x{Val::string}; x.s = &v; return scalar(x); }
  bool binary(nlohmann::json::binary_t&) { return true; }
  bool key(std::string& k) {
    key_ = k;
    if (!levels_[depth_ - 1].insert(k)) {
      dup_ = key_path(k);
      dup_in_event_ = in_event();
    }
    return true;
  }

  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& ex) {
    auto [line, col] = line_col(text_, pos);
    std::string what = ex.what();
    auto colon = what.find(": ");
    if (colon != std::string::npos) what = what.substr(colon + 2);
    std::ostringstream os;
    os << origin_ << ":" << line << ":" << col << ": malformed JSON: " << what;
    throw InputError(os.str());
  }

 private:
  [[noreturn]] void fail_event(const std::string& rule) const {
    throw InputError(origin_ + ": traceEvents[" + std::to_string(index_) + "]: " + rule);
  }
  [[noreturn]] void wrong_type(const std::string& where, const char* want, const Val& v) const {
    fail_event(where + " must be " + want + ", got " + v.kind_name());
  }

  // One open JSON container, for key paths in messages and for repeated keys. Levels are reused from
  // event to event (clear() keeps their capacity), so reading allocates nothing per event for them.
  struct Level {
    bool array = false;
    std::size_t count = 0;          // arrays: elements so far
    bool indexed = false;           // this container is element `index` of an array, else the value of `key`
    std::size_t index = 0;
    std::string key;
    std::vector<std::string> keys;  // objects: keys[0, nkeys) so far, searched linearly while few (events
    std::size_t nkeys = 0;          // have ~10); the strings are reused from object to object
    std::set<std::string> many;     // ... and by a set beyond kLinearKeys
    static constexpr std::size_t kLinearKeys = 32;

    // False when `k` was seen before in this object.
    bool insert(const std::string& k) {
      if (many.empty() && nkeys < kLinearKeys) {
        for (std::size_t i = 0; i < nkeys; ++i)
          if (keys[i] == k) return false;
        if (nkeys == keys.size()) keys.emplace_back(k);
        else keys[nkeys] = k;
        ++nkeys;
        return true;
      }
      if (many.empty()) many.insert(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(nkeys));
      return many.insert(k).second;
    }
  };

  void enter(bool array) {
    if (depth_ == levels_.size()) levels_.emplace_back();
    Level& l = levels_[depth_];
    l.indexed = false;
    if (depth_ > 0) {
      Level& parent = levels_[depth_ - 1];
      l.indexed = parent.array;
      if (parent.array) l.index = parent.count++;
      else l.key = key_;
    }
    ++depth_;
    l.array = array;
    l.count = 0;
    l.nkeys = 0;
    if (!l.many.empty()) l.many.clear();
  }

  bool in_event() const { return std::find(stack_.begin(), stack_.end(), Frame::event) != stack_.end(); }

  // Key path of `k` in the innermost open object: from the event ("args.dur"; the message adds
  // traceEvents[i]) or from the top ("otherData.layout.tp").
  std::string key_path(const std::string& k) const {
    std::size_t from = 1;
    for (std::size_t i = 0; i < stack_.size(); ++i)
      if (stack_[i] == Frame::event) from = i + 1;
    std::string p;
    for (std::size_t i = from; i < depth_; ++i) {
      if (levels_[i].indexed) {
        p += '[';
        p += std::to_string(levels_[i].index);
        p += ']';
      } else {
        if (!p.empty()) p += '.';
        p += levels_[i].key;
      }
    }
    return p.empty() ? k : p + "." + k;
  }

  // A repeated key, reported at its value (named when it is a scalar).
  [[noreturn]] void fail_duplicate(const Val* v) const {
    const std::string rule = dup_ + (v ? " (value " + json_brief(v->to_json()) + ")" : std::string()) +
                             ": duplicate key; each key may appear once in an object (a JSON reader keeps one of "
                             "the values and drops the other without a word)";
    if (dup_in_event_) fail_event(rule);
    throw InputError(origin_ + ": " + rule);
  }

  bool open(bool array) {
    if (!dup_.empty()) fail_duplicate(nullptr);
    enter(array);
    if (stack_.empty()) {
      if (array) {
        doc.bare_array = true;
        stack_.push_back(Frame::events);
      } else {
        stack_.push_back(Frame::top_object);
      }
      return true;
    }
    switch (stack_.back()) {
      case Frame::top_object:
        if (key_ == "traceEvents") {
          if (!array) throw InputError(origin_ + ": traceEvents must be an array of events, got an object");
          saw_events_ = true;
          stack_.push_back(Frame::events);
        } else {
          begin_build(&doc.top[key_], array);
        }
        return true;
      case Frame::events:
        if (array) fail_event("each event must be a JSON object, got an array");
        cur_ = RawEvent{};
        stack_.push_back(Frame::event);
        return true;
      case Frame::event:
        stack_.push_back(key_ == "args" && !array ? Frame::args : Frame::skip);
        return true;
      case Frame::args:
        if (key_ == "layers" && array) {
          layers_.clear();
          stack_.push_back(Frame::layers);
        } else if (key_ == "layers" || typed_arg(key_)) {
          fail_event("args." + key_ + " has the wrong type (" + (array ? "array" : "object") + ")");
        } else {
          if (cur_.extra.is_null()) cur_.extra = nlohmann::json::object();
          begin_build(&cur_.extra[key_], array);
        }
        return true;
      case Frame::layers:
        fail_event("args.layers must be [begin, end] integers");
      case Frame::build: {
        nlohmann::json* parent = builds_.back();
        nlohmann::json* slot;
        if (parent->is_object()) {
          slot = &(*parent)[key_];
        } else {
          parent->push_back(nullptr);
          slot = &parent->back();
        }
        begin_build(slot, array);
        return true;
      }
      case Frame::skip:
        stack_.push_back(Frame::skip);
        return true;
    }
    return true;
  }

  void begin_build(nlohmann::json* slot, bool array) {
    *slot = array ? nlohmann::json::array() : nlohmann::json::object();
    builds_.push_back(slot);
    stack_.push_back(Frame::build);
  }

  bool close() {
    Frame f = stack_.back();
    stack_.pop_back();
    --depth_;
    switch (f) {
      case Frame::top_object:
        if (!saw_events_) {
          std::string keys;
          for (auto it = doc.top.begin(); it != doc.top.end() && keys.size() < 80; ++it) {
            keys += (keys.empty() ? "" : ", ") + it.key();
          }
          throw InputError(origin_ + ": not a Chrome trace: the top-level object has no traceEvents array (keys: " +
                           (keys.empty() ? std::string("none") : keys) + ")");
        }
        break;
      case Frame::event:
        // Perfetto puts an event without pid on process 0, which for a Tessel trace is rank 0 and for a
        // Kineto one device 0: the time would land on a lane it does not belong to.
        if (cur_.ph == "X" && (!cur_.has_pid || !cur_.has_tid))
          fail_event("X event '" + cur_.name + "' without " + (cur_.has_pid ? "tid" : "pid") +
                     "; every X event needs the pid and tid of its lane (Tessel traces: rank and stream; PyTorch "
                     "profiler traces: device and stream)");
        sink_(std::move(cur_), index_);
        ++index_;
        doc.event_count = index_;
        break;
      case Frame::layers:
        if (layers_.size() != 2) fail_event("args.layers must be [begin, end], got " + std::to_string(layers_.size()) + " values");
        cur_.layer_begin = layers_[0];
        cur_.layer_end = layers_[1];
        break;
      case Frame::build:
        builds_.pop_back();
        break;
      default:
        break;
    }
    return true;
  }

  static bool typed_arg(const std::string& k) {
    return k == "op" || k == "stage" || k == "chunk" || k == "mb" || k == "flops" || k == "bytes";
  }

  int small_int(const std::string& where, const Val& v) const {
    if (v.kind != Val::integer) wrong_type(where, "an integer", v);
    if (v.i < -1 || v.i > std::numeric_limits<int>::max()) fail_event(where + " = " + std::to_string(v.i) + " is out of range [-1, 2^31)");
    return static_cast<int>(v.i);
  }

  double finite_number(const std::string& where, const Val& v) const {
    if (!v.is_number()) wrong_type(where, "a number", v);
    return v.number();
  }

  // ts in [-kMaxTraceTimeUs, kMaxTraceTimeUs], dur in [0, kMaxTraceTimeUs] (event_reader.hpp).
  double time_us(const std::string& k, const Val& v) const {
    const double x = finite_number(k, v);
    if (k == "dur" && x < 0)
      fail_event("negative dur " + json_brief(v.to_json()) + "; a duration is in [0, " + kMaxTimeText + "]");
    if (std::fabs(x) > kMaxTraceTimeUs)
      fail_event(k + " " + json_brief(v.to_json()) + " is beyond +-" + kMaxTimeText + "; that is not a time a trace can hold");
    return x;
  }

  bool scalar(const Val& v) {
    if (!dup_.empty()) fail_duplicate(&v);
    if (depth_ > 0 && levels_[depth_ - 1].array) ++levels_[depth_ - 1].count;
    if (stack_.empty()) {
      throw InputError(origin_ + ": not a Chrome trace: the document is a single " + std::string(v.kind_name()) +
                       ", expected an array of events or an object with traceEvents");
    }
    switch (stack_.back()) {
      case Frame::top_object:
        if (key_ == "traceEvents") throw InputError(origin_ + ": traceEvents must be an array of events, got a " + std::string(v.kind_name()));
        doc.top[key_] = v.to_json();
        break;
      case Frame::events:
        fail_event(std::string("each event must be a JSON object, got a ") + v.kind_name());
      case Frame::event: event_field(v); break;
      case Frame::args: arg_field(v); break;
      case Frame::layers: layers_.push_back(small_int("args.layers[" + std::to_string(layers_.size()) + "]", v)); break;
      case Frame::build: {
        nlohmann::json* parent = builds_.back();
        if (parent->is_object()) (*parent)[key_] = v.to_json();
        else parent->push_back(v.to_json());
        break;
      }
      case Frame::skip: break;
    }
    return true;
  }

  void id_field(std::int64_t& num, bool& is_text, std::string& text, const Val& v) {
    if (v.kind == Val::integer) num = v.i;
    else if (v.kind == Val::string) { is_text = true; text = *v.s; }
    else wrong_type(key_, "an integer or a string", v);
  }

  void event_field(const Val& v) {
    const std::string& k = key_;
    auto text = [&](std::string& out) {
      if (v.kind != Val::string) wrong_type(k, "a string", v);
      out = *v.s;
    };
    if (k == "ph") text(cur_.ph);
    else if (k == "name") text(cur_.name);
    else if (k == "cat") text(cur_.cat);
    else if (k == "pid") { id_field(cur_.pid, cur_.pid_is_string, cur_.pid_text, v); cur_.has_pid = true; }
    else if (k == "tid") { id_field(cur_.tid, cur_.tid_is_string, cur_.tid_text, v); cur_.has_tid = true; }
    else if (k == "ts") { cur_.ts = time_us(k, v); cur_.has_ts = true; }
    else if (k == "dur") { cur_.dur = time_us(k, v); cur_.has_dur = true; }
    else if (k == "id") {
      if (v.kind == Val::integer) cur_.id = std::to_string(v.i);
      else if (v.kind == Val::string) cur_.id = *v.s;
      else wrong_type(k, "an integer or a string", v);
    } else if (k == "bp") text(cur_.bp);
    else if (k == "bind_id") {
      if (v.kind != Val::integer) wrong_type(k, "an integer", v);
      cur_.bind_id = v.i;
    } else if (k == "flow_in" || k == "flow_out") {
      if (v.kind != Val::boolean) wrong_type(k, "a boolean", v);
      (k == "flow_in" ? cur_.flow_in : cur_.flow_out) = v.b;
    }
    // Other keys (s, cname, id2, ...) carry nothing Tessel uses.
  }

  void arg_field(const Val& v) {
    const std::string& k = key_;
    if (k == "op") {
      if (v.kind != Val::string) wrong_type("args.op", "a string", v);
      cur_.op = *v.s;
      cur_.has_op = true;
    } else if (k == "stage") cur_.stage = small_int("args.stage", v);
    else if (k == "chunk") cur_.chunk = small_int("args.chunk", v);
    else if (k == "mb") cur_.mb = small_int("args.mb", v);
    else if (k == "flops") cur_.flops = finite_number("args.flops", v);
    else if (k == "bytes") { cur_.bytes = finite_number("args.bytes", v); cur_.has_bytes = true; }
    else if (k == "layers") wrong_type("args.layers", "[begin, end]", v);
    else {
      if (cur_.extra.is_null()) cur_.extra = nlohmann::json::object();
      cur_.extra[k] = v.to_json();
    }
  }

  const std::string& text_;
  const std::string& origin_;
  const EventSink& sink_;
  std::vector<Frame> stack_;
  std::vector<Level> levels_;  // levels_[0, depth_) are open; stack_ has one frame per open level
  std::size_t depth_ = 0;
  std::string dup_;            // key path of a repeated key, reported at its value
  bool dup_in_event_ = false;
  std::vector<nlohmann::json*> builds_;
  std::vector<int> layers_;
  std::string key_;
  RawEvent cur_;
  std::size_t index_ = 0;
  bool saw_events_ = false;
};

}  // namespace

std::string read_trace_bytes(const std::string& path) {
  std::string bytes = read_file_bytes(path);
  if (is_gzip(bytes)) return gunzip(bytes, path);
  return bytes;
}

TraceDocument read_events(const std::string& text, const std::string& origin, const EventSink& sink) {
  Handler h(text, origin, sink);
  nlohmann::json::sax_parse(text.begin(), text.end(), &h);
  return std::move(h.doc);
}

}  // namespace tessel::trace
