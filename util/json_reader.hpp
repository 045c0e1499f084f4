// Strict JSON reading at the edge: every input file goes through here once.
//
// - parse_json_file / parse_json_text give malformed JSON as "file:line:column: message", and reject a key
//   repeated in one object (nlohmann would keep the last value) as "file: key.path: duplicate key ...".
// - JsonObject reads one object with a key path for messages; finish() rejects keys nobody read, so
//   unknown and missing keys are both errors. Numbers are range-checked and NaN/inf rejected.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace tessel {

using Json = nlohmann::json;

// Reads and parses a whole file; InputError names file:line:column on a syntax error, file and key path on a
// repeated key. `what` (the flag the path came from, with a trailing space: "--layout ") leads the messages
// that are about the path itself (a directory, unreadable).
Json parse_json_file(const std::string& path, const std::string& what = "");
// `origin` names the source in messages (a file name, "<stdin>", "--layout").
Json parse_json_text(const std::string& text, const std::string& origin);
// 1-based line and column of byte offset `byte` (as JSON parsers report positions) in `text`.
std::pair<std::size_t, std::size_t> line_col(const std::string& text, std::size_t byte);
// Reads a whole file into a string; InputError "<what><path>: ..." if it cannot be read or is a directory.
std::string read_text_file(const std::string& path, const std::string& what = "");
// InputError "<what><path>: is a directory, not a file" when `path` names a directory. Every file reader
// calls it first: on Linux an ifstream opens a directory without complaint, and reading it then fails
// (EISDIR) or returns nothing, which readers reported as an empty, malformed or oversized file.
void refuse_directory(const std::string& path, const std::string& what = "");

class JsonObject {
 public:
  // `where` is the file (or other origin); `path` the key path of this object inside it ("" for the root).
  JsonObject(const Json& j, std::string where, std::string path = "");

  bool has(const std::string& key) const;
  const Json& raw(const std::string& key);  // marks the key read; InputError if missing

  std::int64_t integer(const std::string& key, std::int64_t min, std::int64_t max);
  std::optional<std::int64_t> opt_integer(const std::string& key, std::int64_t min, std::int64_t max);
  double number(const std::string& key, double min, double max);
  std::optional<double> opt_number(const std::string& key, double min, double max);
  bool boolean(const std::string& key);
  std::optional<bool> opt_boolean(const std::string& key);
  std::string string(const std::string& key);
  std::optional<std::string> opt_string(const std::string& key);
  // One of `allowed`; the message lists them.
  std::string choice(const std::string& key, const std::vector<std::string>& allowed);
  JsonObject object(const std::string& key);
  std::vector<double> number_array(const std::string& key, double min, double max);

  // Marks keys as known but ignored (documentation fields such as "source").
  void ignore(const std::string& key);
  // InputError naming the first key that was never read.
  void finish() const;

  [[noreturn]] void fail(const std::string& key, const std::string& rule) const;
  std::string key_path(const std::string& key) const;
  const std::string& where() const { return where_; }

 private:
  const Json& j_;
  std::string where_;
  std::string path_;
  std::set<std::string> seen_;
};

// Renders a JSON value for an error message, shortened.
std::string json_brief(const Json& v);

}  // namespace tessel
