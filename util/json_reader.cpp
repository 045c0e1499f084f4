#include "util/json_reader.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessel {

// nlohmann reports a byte offset; users want line and column.
std::pair<std::size_t, std::size_t> line_col(const std::string& text, std::size_t byte) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < text.size() && i + 1 < byte; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

void refuse_directory(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(what + path + ": is a directory, not a file");
}

std::string read_text_file(const std::string& path, const std::string& what) {
  refuse_directory(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(what + path + ": cannot open file for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read error");
  return ss.str();
}

namespace {

// nlohmann keeps the last of repeated keys in an object; RFC 8259 leaves them undefined, and a repeated key
// in an input file is a mistake whose first value would be dropped without a word. This parser callback keeps
// the keys seen per open object and rejects a repeat, naming its key path ("parallel.d", "rows[3].id").
class DuplicateKeyCheck {
 public:
  explicit DuplicateKeyCheck(const std::string& origin) : origin_(origin) {}

  bool operator()(int, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (!repeated_.empty()) {
      // The event after a repeated key gives its value when that is a scalar.
      const std::string value = event == E::value ? " (value " + json_brief(parsed) + ")" : "";
      throw InputError(origin_ + ": " + repeated_ + value + ": duplicate key; each key may appear once in an object");
    }
    switch (event) {
      case E::object_start:
      case E::array_start:
        frames_.push_back({event == E::object_start, {}, {}, 0});
        break;
      case E::key: {
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second) repeated_ = path();
        break;
      }
      case E::object_end:
      case E::array_end:
        frames_.pop_back();
        element_done();
        break;
      case E::value:
        element_done();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;        // objects: the key whose value is being read
    std::size_t index;      // arrays: the element being read
  };

  void element_done() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }

  std::string path() const {
    std::string p;
    for (const auto& f : frames_) {
      if (f.object) {
        if (!p.empty()) p += '.';
        p += f.key;
      } else {
        p += '[';
        p += std::to_string(f.index);
        p += ']';
      }
    }
    return p;
  }

  const std::string& origin_;
  std::vector<Frame> frames_;
  std::string repeated_;
};

}  // namespace

Json parse_json_text(const std::string& text, const std::string& origin) {
  try {
    return Json::parse(text, DuplicateKeyCheck(origin));
  } catch (const Json::parse_error& e) {
    auto [line, col] = line_col(text, e.byte);
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
    auto colon = what.find(": ");
    if (colon != std::string::npos) what = what.substr(colon + 2);
    std::ostringstream os;
    os << origin << ":" << line << ":" << col << ": malformed JSON: " << what;
    throw InputError(os.str());
  } catch (const Json::out_of_range& e) {
    // A number literal too large for a double (1e400): nlohmann reports it as out_of_range (406), without
    // a position. Found by tests/fuzz (regressions/model_json).
    std::string what = e.what();
    auto colon = what.find("] ");
    throw InputError(origin + ": malformed JSON: " + (colon != std::string::npos ? what.substr(colon + 2) : what));
  }
}

Json parse_json_file(const std::string& path, const std::string& what) {
  return parse_json_text(read_text_file(path, what), path);
}

std::string json_brief(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

JsonObject::JsonObject(const Json& j, std::string where, std::string path)
    : j_(j), where_(std::move(where)), path_(std::move(path)) {
  if (!j_.is_object()) {
    throw InputError(where_ + ": " + (path_.empty() ? std::string("the document") : path_) +
                     " must be a JSON object, got " + json_brief(j_));
  }
}

std::string JsonObject::key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void JsonObject::fail(const std::string& key, const std::string& rule) const {
  throw InputError(where_ + ": " + key_path(key) + ": " + rule);
}

bool JsonObject::has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

const Json& JsonObject::raw(const std::string& key) {
  seen_.insert(key);
  if (!j_.contains(key)) fail(key, "missing required key");
  return j_.at(key);
}

void JsonObject::ignore(const std::string& key) { seen_.insert(key); }

std::int64_t JsonObject::integer(const std::string& key, std::int64_t min, std::int64_t max) {
  const Json& v = raw(key);
  std::int64_t x = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      fail(key, "value " + json_brief(v) + " is too large");
    x = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
      fail(key, "value " + json_brief(v) + " must be an integer");
    x = static_cast<std::int64_t>(d);
  } else {
    fail(key, "value " + json_brief(v) + " must be an integer");
  }
  if (x < min || x > max) {
    std::ostringstream os;
    os << "value " << x << " is out of range [" << min << ", " << max << "]";
    fail(key, os.str());
  }
  return x;
}

std::optional<std::int64_t> JsonObject::opt_integer(const std::string& key, std::int64_t min, std::int64_t max) {
  seen_.insert(key);
  if (!has(key)) return std::nullopt;
  return integer(key, min, max);
}

double JsonObject::number(const std::string& key, double min, double max) {
  const Json& v = raw(key);
  if (!v.is_number()) fail(key, "value " + json_brief(v) + " must be a number");
  double x = v.get<double>();
  if (!std::isfinite(x)) fail(key, "value must be finite");
  if (x < min || x > max) {
    std::ostringstream os;
    os << "value " << x << " is out of range [" << min << ", " << max << "]";
    fail(key, os.str());
  }
  return x;
}

std::optional<double> JsonObject::opt_number(const std::string& key, double min, double max) {
  seen_.insert(key);
  if (!has(key)) return std::nullopt;
  return number(key, min, max);
}

bool JsonObject::boolean(const std::string& key) {
  const Json& v = raw(key);
  if (!v.is_boolean()) fail(key, "value " + json_brief(v) + " must be true or false");
  return v.get<bool>();
}

std::optional<bool> JsonObject::opt_boolean(const std::string& key) {
  seen_.insert(key);
  if (!has(key)) return std::nullopt;
  return boolean(key);
}

std::string JsonObject::string(const std::string& key) {
  const Json& v = raw(key);
  if (!v.is_string()) fail(key, "value " + json_brief(v) + " must be a string");
  return v.get<std::string>();
}

std::optional<std::string> JsonObject::opt_string(const std::string& key) {
  seen_.insert(key);
  if (!has(key)) return std::nullopt;
  return string(key);
}

std::string JsonObject::choice(const std::string& key, const std::vector<std::string>& allowed) {
  std::string s = string(key);
  for (const auto& a : allowed)
    if (a == s) return s;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  fail(key, "value \"" + s + "\" is not one of: " + list);
}

JsonObject JsonObject::object(const std::string& key) {
  const Json& v = raw(key);
  if (!v.is_object()) fail(key, "value " + json_brief(v) + " must be an object");
  return JsonObject(v, where_, key_path(key));
}

std::vector<double> JsonObject::number_array(const std::string& key, double min, double max) {
  const Json& v = raw(key);
  if (!v.is_array()) fail(key, "value " + json_brief(v) + " must be an array of numbers");
  std::vector<double> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const Json& e = v[i];
    std::string k = key + "[" + std::to_string(i) + "]";
    if (!e.is_number()) fail(k, "value " + json_brief(e) + " must be a number");
    double x = e.get<double>();
    if (!std::isfinite(x) || x < min || x > max) {
      std::ostringstream os;
      os << "value " << json_brief(e) << " is out of range [" << min << ", " << max << "]";
      fail(k, os.str());
    }
    out.push_back(x);
  }
  return out;
}

void JsonObject::finish() const {
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (!seen_.count(it.key())) fail(it.key(), "unknown key");
  }
}

}  // namespace tessel
