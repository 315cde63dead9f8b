// Socket addresses for the bootstrap: parsing "host:port" forms, resolving
// names, and choosing what rank 0 advertises.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace flatmem::comm::ucx {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr *get() const { return reinterpret_cast<const sockaddr *>(&storage); }
  std::uint16_t port() const;
  void set_port(std::uint16_t port);
  std::string text() const;  // "10.0.0.5:4000", "[::1]:4000"
};

struct HostPort {
  std::string host;  // "" when not given
  int port = 0;
};

// "host:port", "host", ":port", "[v6]:port"; `what` names the source in
// messages (e.g. "FLATMEM_COORDINATOR"). INVALID_ARGUMENT when malformed.
HostPort parse_host_port(const std::string &text, const char *what);

// A name or numeric address (IPv4 preferred); INVALID_ARGUMENT naming `what`.
SocketAddress resolve(const std::string &host, int port, const char *what);

// 0.0.0.0:port.
SocketAddress any_address(int port);

// The address other hosts can reach this one at: the first up, non-loopback
// IPv4 interface; 127.0.0.1 when there is none.
SocketAddress advertised_address(int port);

}  // namespace flatmem::comm::ucx
