// Helpers for the checkpoint tests: a fresh temp folder and a small sharded "model" whose values are a
// closed-form function of the global index, so any slice's expected content is computed independently.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/crc32c.hpp"

namespace tessel::test {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("tessel-ckpt-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Element (i, j) of the logical tensor `salt`: distinct per tensor and index, exact in fp32.
inline float weight(int salt, std::uint64_t i, std::uint64_t j) {
  return static_cast<float>(salt * 100000 + static_cast<int>(i) * 1000 + static_cast<int>(j)) * 0.5f;
}

// Saves under "tp = world" row sharding: tensor "w" [rows, cols] split by rows; "optim.m.w" likewise with
// salt 2; "b" [cols] only on rank 0 (replicated elsewhere); a per-rank blob "rng" = "rng-of-<rank>".
inline void save_rows(rt::CheckpointWriter& w, int rank, int world, std::uint64_t rows, std::uint64_t cols) {
  std::uint64_t per = rows / world;
  for (int salt : {1, 2}) {
    std::vector<float> piece(per * cols);
    for (std::uint64_t i = 0; i < per; ++i)
      for (std::uint64_t j = 0; j < cols; ++j) piece[i * cols + j] = weight(salt, rank * per + i, j);
    w.add_tensor(salt == 1 ? "w" : "optim.m.w", {rows, cols}, {rank * per, 0}, {per, cols}, piece.data());
  }
  if (rank == 0) {
    std::vector<float> b(cols);
    for (std::uint64_t j = 0; j < cols; ++j) b[j] = weight(3, 0, j);
    w.add_tensor("b", {cols}, {0}, {cols}, b.data());
  }
  w.add_blob("rng", "rng-of-" + std::to_string(rank));
}

inline std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every file of a folder with its content, to prove a checkpoint was not touched.
inline std::vector<std::pair<std::string, std::string>> snapshot(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> files;
  for (auto& e : fs::directory_iterator(dir)) files.push_back({e.path().filename().string(), file_bytes(e.path())});
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace tessel::test

namespace tessel::test {
inline void write_text(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

// Edits the `meta` object of a step folder's meta.json and recomputes its size and CRC32C in the manifest, as
// someone who knows the format would: the checksums then pass, and the metadata must be checked on its own.
template <class F>
inline void edit_meta(const fs::path& folder, F&& edit) {
  Json meta = Json::parse(file_bytes(folder / "meta.json"));
  edit(meta["meta"]);
  const std::string text = meta.dump(2) + "\n";
  write_text(folder / "meta.json", text);
  Json man = Json::parse(file_bytes(folder / "manifest.json"));
  man["files"][0]["bytes"] = text.size();
  man["files"][0]["crc32c"] = rt::crc_hex(rt::crc32c(text.data(), text.size()));
  write_text(folder / "manifest.json", man.dump(2) + "\n");
}
}  // namespace tessel::test
