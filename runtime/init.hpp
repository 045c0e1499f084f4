// Seeded, order-free random numbers for initialisation and synthetic data. Every value is a pure function
// of (seed, tensor name, element index), so a tensor sharded over any layout holds exactly the elements
// of the single-rank tensor, and tools/torch_golden.py reproduces them bit for bit in Python.
//
// mix64 is SplitMix64's finaliser (Steele, Lea & Flood, OOPSLA 2014; constants from Vigna's splitmix64.c).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel::rt {

std::uint64_t mix64(std::uint64_t z);
// FNV-1a 64-bit hash of the name (offset 0xcbf29ce484222325, prime 0x100000001b3), mixed with the seed.
std::uint64_t tensor_key(std::uint64_t seed, const std::string& name);
// Uniform in [-sqrt(3) std, sqrt(3) std) (variance std^2): u = top 24 bits of mix64(key + (i+1) * golden)
// / 2^24, value = (2u - 1) * (std * sqrt(3)) in double, rounded to float once.
float init_uniform(std::uint64_t key, std::int64_t index, double stddev);
// Gaussian of mean 0 and standard deviation std (Box-Muller): u1, u2 = the top 53 bits of
// mix64(key + (2i+1) golden) and mix64(key + (2i+2) golden) / 2^53, u1 taken in (0, 1];
// value = std sqrt(-2 ln u1) cos(2 pi u2) in double, rounded to float once. For data that must look like a
// layer's (tessel bench's kernel inputs), not for initialisation (init_uniform is what torch_golden.py mirrors).
float init_normal(std::uint64_t key, std::int64_t index, double stddev);

// Token source: a synthetic stream, or a file's bytes (vocab 256) read cyclically.
// Synthetic token i = (mix64(key + (i >> 4)) mod V + 3 i) mod V with key = tensor_key(seed, "data"):
// runs of 16 tokens counting up by 3 from a random start, so a model can learn something in a few steps.
class TokenStream {
 public:
  static TokenStream synthetic(std::uint64_t seed, int vocab);
  // Throws InputError naming the file when it cannot be read, is a directory or is empty, or vocab < 256.
  static TokenStream from_file(const std::string& path, int vocab);

  std::int32_t at(std::int64_t i) const;
  // Sample j of a run: inputs = tokens [j*seq, (j+1)*seq), targets shifted by one.
  void sample(std::int64_t j, int seq, std::int32_t* inputs, std::int32_t* targets) const;
  std::string describe() const;

 private:
  std::uint64_t key_ = 0;
  int vocab_ = 0;
  std::vector<std::uint8_t> bytes_;  // empty for synthetic
  std::string path_;
};

}  // namespace tessel::rt
