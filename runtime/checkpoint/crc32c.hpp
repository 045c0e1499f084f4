// CRC32C (Castagnoli): the checksum of every checkpoint file, as iSCSI, ext4 metadata and Google's crc32c use.
// Our own table-driven implementation (no Debian package provides a C/C++ CRC32C library we want to depend
// on for one function). Reflected polynomial 0x82F63B78; init and final xor 0xFFFFFFFF (RFC 3720 B.4);
// check value crc32c("123456789") = 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessel::rt {

// Continues a CRC over more bytes: crc32c_extend(crc32c_extend(0, a), b) == crc32c(a + b).
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n);
inline std::uint32_t crc32c(const void* data, std::size_t n) { return crc32c_extend(0, data, n); }

// "e3069283": how manifests spell a CRC.
std::string crc_hex(std::uint32_t crc);

}  // namespace tessel::rt
