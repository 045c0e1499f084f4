#include "runtime/init.hpp"

#include <cmath>
#include <fstream>
#include <ios>
#include <iterator>

#include "util/error.hpp"
#include "util/json_reader.hpp"

namespace tessel::rt {

namespace {
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / phi, SplitMix64's increment
}

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t tensor_key(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return mix64(h ^ mix64(seed + kGolden));
}

float init_uniform(std::uint64_t key, std::int64_t index, double stddev) {
  const std::uint64_t r = mix64(key + static_cast<std::uint64_t>(index + 1) * kGolden);
  const double u = static_cast<double>(r >> 40) / 16777216.0;
  return static_cast<float>((2.0 * u - 1.0) * (stddev * std::sqrt(3.0)));
}

float init_normal(std::uint64_t key, std::int64_t index, double stddev) {
  constexpr double kTwoPi = 6.283185307179586, k2to53 = 9007199254740992.0;
  const auto i = static_cast<std::uint64_t>(index);
  const std::uint64_t a = mix64(key + (2 * i + 1) * kGolden), b = mix64(key + (2 * i + 2) * kGolden);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) / k2to53, u2 = static_cast<double>(b >> 11) / k2to53;
  return static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
}

TokenStream TokenStream::synthetic(std::uint64_t seed, int vocab) {
  TESSEL_CHECK(vocab > 0);
  TokenStream t;
  t.key_ = tensor_key(seed, "data");
  t.vocab_ = vocab;
  return t;
}

TokenStream TokenStream::from_file(const std::string& path, int vocab) {
  if (vocab < 256)
    throw InputError("--data " + path + ": byte tokens need a vocabulary of at least 256, the model has " +
                     std::to_string(vocab));
  refuse_directory(path, "--data ");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("--data " + path + ": cannot open the file");
  TokenStream t;
  try {
    t.bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& e) {
    // libstdc++'s filebuf throws from underflow on a read error (EIO, a file that vanished).
    throw InputError("--data " + path + ": read error (" + e.what() + ")");
  }
  if (t.bytes_.size() < 2) throw InputError("--data " + path + ": needs at least 2 bytes of text");
  t.vocab_ = vocab;
  t.path_ = path;
  return t;
}

std::int32_t TokenStream::at(std::int64_t i) const {
  if (!bytes_.empty()) return bytes_[static_cast<std::size_t>(i % static_cast<std::int64_t>(bytes_.size()))];
  const std::uint64_t v = static_cast<std::uint64_t>(vocab_);
  return static_cast<std::int32_t>((mix64(key_ + static_cast<std::uint64_t>(i >> 4)) % v + 3 * static_cast<std::uint64_t>(i)) % v);
}

void TokenStream::sample(std::int64_t j, int seq, std::int32_t* inputs, std::int32_t* targets) const {
  for (int i = 0; i < seq; ++i) {
    inputs[i] = at(j * seq + i);
    targets[i] = at(j * seq + i + 1);
  }
}

std::string TokenStream::describe() const {
  return bytes_.empty() ? "synthetic" : "bytes of " + path_;
}

}  // namespace tessel::rt
