#include "tools/cli.hpp"

#include <iostream>
#include <sstream>

#include "util/error.hpp"
#include "util/suggest.hpp"

namespace tessel::cli {

CommandLine::CommandLine(const std::string& verb, const std::vector<std::string>& args,
                         std::vector<OptionSpec> specs, std::size_t max_positional)
    : verb_(verb), specs_(std::move(specs)) {
  auto find = [&](const std::string& name) -> const OptionSpec* {
    for (const auto& s : specs_)
      if (s.name == name) return &s;
    return nullptr;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.size() > 2 && a.rfind("--", 0) == 0) {
      std::string name = a, value;
      bool inline_value = false;
      if (auto eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        inline_value = true;
      }
      const OptionSpec* s = find(name);
      if (!s) {
        std::vector<std::string> names;
        for (const auto& o : specs_) names.push_back(o.name);
        throw InputError("unknown flag " + name + did_you_mean(name, names) + " (tessel " + verb_ + " --help lists them)");
      }
      if (values_.count(name)) throw InputError("flag " + name + " given twice");
      if (s->takes_value) {
        if (!inline_value) {
          if (i + 1 >= args.size()) throw InputError("flag " + name + " needs a value");
          value = args[++i];
        }
      } else if (inline_value) {
        throw InputError("flag " + name + " takes no value");
      }
      values_[name] = value;
    } else if (a == "-o") {
      const OptionSpec* s = find("-o");
      if (!s) throw InputError("unknown flag -o (tessel " + verb_ + " --help lists the flags)");
      if (i + 1 >= args.size()) throw InputError("flag -o needs a value");
      values_["-o"] = args[++i];
    } else {
      positional_.push_back(a);
    }
  }
  if (!help_ && positional_.size() > max_positional) {
    throw InputError("unexpected argument '" + positional_[max_positional] + "' (tessel " + verb_ + " --help)");
  }
}

std::optional<std::string> CommandLine::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string CommandLine::get_or(const std::string& name, const std::string& fallback) const {
  auto v = get(name);
  return v ? *v : fallback;
}

std::optional<std::int64_t> CommandLine::get_int(const std::string& name, std::int64_t min, std::int64_t max) const {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_int(*v, name, min, max);
}

std::optional<double> CommandLine::get_double(const std::string& name, double min, double max) const {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_double(*v, name, min, max);
}

std::vector<std::string> CommandLine::get_list(const std::string& name) const {
  std::vector<std::string> out;
  auto v = get(name);
  if (!v) return out;
  std::stringstream ss(*v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw InputError(name + ": empty item in list '" + *v + "'");
    out.push_back(item);
  }
  if (out.empty()) throw InputError(name + ": empty list");
  return out;
}

std::vector<std::int64_t> CommandLine::get_int_list(const std::string& name, std::int64_t min, std::int64_t max) const {
  std::vector<std::int64_t> out;
  for (const auto& s : get_list(name)) out.push_back(parse_int(s, name, min, max));
  return out;
}

std::string CommandLine::usage() const {
  std::ostringstream os;
  os << "usage: tessel " << verb_ << " [options]\n";
  for (const auto& s : specs_) {
    os << "  " << s.name << (s.takes_value ? " VALUE" : "");
    std::size_t w = s.name.size() + (s.takes_value ? 6 : 0);
    os << std::string(w < 24 ? 24 - w : 1, ' ') << s.help << "\n";
  }
  return os.str();
}

bool CommandLine::print_help(const std::string& before, const std::string& after) const {
  if (help_) std::cout << before << usage() << after;
  return help_;
}

}  // namespace tessel::cli
