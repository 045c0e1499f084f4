// A fixed one-rank checkpoint for the checkpoint fuzz targets and their seed corpus (make_fuzz_seeds).
#pragma once

#include <string>
#include <string_view>

namespace tessel::fuzz {

// meta.json of a step-1, world-1 checkpoint.
std::string fixture_meta_json();
// The manifest that lists `meta` and `shard` with their true sizes and CRC32C.
std::string fixture_manifest_json(std::string_view meta, std::string_view shard);
// The bytes of a valid shard: a 2-d tensor "w" [4, 3], a 1-d tensor "b" [5] and a blob "rng".
std::string fixture_shard_bytes();
// Writes meta.json, rank-00000.shard and manifest.json of that checkpoint into `dir`.
void write_fixture_checkpoint(const std::string& dir);

}  // namespace tessel::fuzz
