// Output files are written to a temporary name in the same folder, flushed and fsync'ed, then renamed,
// so an interrupted command never leaves a half-written file under the requested name. A path that names
// a character device or a FIFO (/dev/null, /dev/stdout, a named pipe) is written into directly, since the
// rename would replace the node itself; a block device or a socket is refused. A symbolic link to a file
// is kept: the file it names is replaced.
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
