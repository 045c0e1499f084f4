// Output files are written to a temporary name in the same folder, flushed and fsync'ed, then renamed,
// so an interrupted command never leaves a half-written file under the requested name.
#pragma once

#include <string>
#include <string_view>

namespace tessel {

// InputError (naming the path) if the folder cannot be written.
void write_file_atomic(const std::string& path, std::string_view content);

// Checks up front that `path` can be created (its folder exists and is writable), so a long run fails
// before it starts rather than after. InputError naming `flag` and the path otherwise.
void check_writable(const std::string& path, const std::string& flag);

}  // namespace tessel
