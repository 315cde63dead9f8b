// The bootstrap's three messages, as bytes:
//   hello   member -> rank 0: session, rank, world size, worker address
//   roster  rank 0 -> members: every rank's worker address
//   reject  rank 0 -> a member it refuses: status and reason
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flatmem::comm::ucx {

struct Hello {
  std::uint64_t session = 0;
  std::int32_t rank = 0, world = 0;
  std::vector<char> address;
};
struct Reject {
  flatmem_status status = FLATMEM_STATUS_INVALID_ARGUMENT;
  std::string reason;
};

std::vector<char> encode(const Hello &hello);
std::vector<char> encode(const std::vector<std::vector<char>> &roster);
std::vector<char> encode(const Reject &reject);

// Each returns false when the bytes are not such a message (of this version).
bool decode(const std::vector<char> &bytes, std::size_t length, Hello *hello);
bool decode(const std::vector<char> &bytes, std::size_t length, std::vector<std::vector<char>> *roster);
bool decode(const std::vector<char> &bytes, std::size_t length, Reject *reject);

}  // namespace flatmem::comm::ucx
