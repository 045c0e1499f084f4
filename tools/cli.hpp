// A small, strict command-line reader: each command declares its options; anything else is an error
// naming the flag. Values are range-checked where they are read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "util/text_numbers.hpp"

namespace tessel::cli {

struct OptionSpec {
  std::string name;       // "--tp"
  bool takes_value;       // false: a switch such as --json
  std::string help;       // one line for `tessel VERB --help`
};

class CommandLine {
 public:
  // Throws InputError for an unknown flag, a missing value, or a repeated flag.
  CommandLine(const std::string& verb, const std::vector<std::string>& args, std::vector<OptionSpec> specs,
              std::size_t max_positional);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  bool flag(const std::string& name) const { return has(name); }
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& fallback) const;
  std::optional<std::int64_t> get_int(const std::string& name, std::int64_t min, std::int64_t max) const;
  std::optional<double> get_double(const std::string& name, double min, double max) const;
  // Comma-separated list ("1f1b,zbv").
  std::vector<std::string> get_list(const std::string& name) const;
  std::vector<std::int64_t> get_int_list(const std::string& name, std::int64_t min, std::int64_t max) const;

  const std::vector<std::string>& positional() const { return positional_; }
  bool help_requested() const { return help_; }
  std::string usage() const;
  // Prints usage() on stdout (between `before` and `after`) when --help was given and says so:
  // `if (cl.print_help()) return 0;`.
  bool print_help(const std::string& before = "", const std::string& after = "") const;
  const std::string& verb() const { return verb_; }

 private:
  std::string verb_;
  std::vector<OptionSpec> specs_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// A whole string as an integer or a finite number in [min, max]; InputError naming `what` otherwise
// (util/text_numbers.hpp, shared with the layout words).
using tessel::parse_double;
using tessel::parse_int;

}  // namespace tessel::cli
