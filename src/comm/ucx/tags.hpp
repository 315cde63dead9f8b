// How flatmem lays out UCX's 64-bit tags, and UCX statuses as text.
//
//   bits 63..60  kind (user message, library-internal, cyclic chains, abort
//                notice, bootstrap, goodbye)
//   bits 59..40  source rank (so receives can name the sender)
//   bits 39..0   value: the user's 32-bit tag, an internal (sequence, slot)
//                tag, or a bootstrap message type
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>

namespace flatmem::comm::ucx {

enum class Kind : std::uint64_t {
  user = 1, internal = 2, abort_notice = 3, bootstrap = 4, goodbye = 5, cyclic = 6
};

// Bootstrap message types (the value field of Kind::bootstrap).
enum class Boot : std::uint64_t { hello = 1, roster = 2, reject = 3, ready = 4 };

inline constexpr int max_ranks = 1 << 20;
inline constexpr std::uint64_t value_bits = (std::uint64_t(1) << 40) - 1;
inline constexpr std::uint64_t kind_bits = std::uint64_t(0xf) << 60;
inline constexpr std::uint64_t every_bit = ~std::uint64_t(0);
// Matches kind and value, any source.
inline constexpr std::uint64_t any_source = kind_bits | value_bits;

constexpr std::uint64_t make_tag(Kind kind, int source, std::uint64_t value) {
  return (std::uint64_t(kind) << 60) | (std::uint64_t(source & (max_ranks - 1)) << 40) |
         (value & value_bits);
}
constexpr int tag_source(std::uint64_t tag) { return int((tag >> 40) & (max_ranks - 1)); }

// "Connection reset by remote peer (UCS status -25)".
inline std::string ucs_text(ucs_status_t status) {
  return std::string(ucs_status_string(status)) + " (UCS status " + std::to_string(int(status)) +
         ")";
}

}  // namespace flatmem::comm::ucx
