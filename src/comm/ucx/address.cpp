#include "comm/ucx/address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

#include "core/error.hpp"

namespace flatmem::comm::ucx {

std::uint16_t SocketAddress::port() const {
  if (storage.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6 *>(&storage)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in *>(&storage)->sin_port);
}

void SocketAddress::set_port(std::uint16_t port) {
  if (storage.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6 *>(&storage)->sin6_port = htons(port);
  else
    reinterpret_cast<sockaddr_in *>(&storage)->sin_port = htons(port);
}

std::string SocketAddress::text() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(&storage)->sin6_addr, host,
              sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(&storage)->sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(port());
}

HostPort parse_host_port(const std::string &text, const char *what) {
  HostPort result;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos) invalid(what, "=\"", text, "\": missing ']'");
    result.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') invalid(what, "=\"", text, "\": expected ':' after ']'");
      port_text = text.substr(close + 2);
    }
  } else {
    const auto colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') != colon)
      invalid(what, "=\"", text, "\": write IPv6 addresses as [address]:port");
    result.host = text.substr(0, colon);
    if (colon != std::string::npos) port_text = text.substr(colon + 1);
  }
  if (!port_text.empty()) {
    char *end = nullptr;
    const long port = std::strtol(port_text.c_str(), &end, 10);
    if (*end != '\0' || port < 0 || port > 65535)
      invalid(what, "=\"", text, "\": port \"", port_text, "\" is not 0 .. 65535");
    result.port = int(port);
  }
  return result;
}

SocketAddress resolve(const std::string &host, int port, const char *what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr)
    invalid(what, ": cannot resolve host \"", host, "\": ", gai_strerror(rc));
  const addrinfo *pick = found;
  for (const addrinfo *a = found; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  SocketAddress address;
  std::memcpy(&address.storage, pick->ai_addr, pick->ai_addrlen);
  address.length = pick->ai_addrlen;
  freeaddrinfo(found);
  address.set_port(std::uint16_t(port));
  return address;
}

SocketAddress any_address(int port) {
  SocketAddress address;
  auto *in = reinterpret_cast<sockaddr_in *>(&address.storage);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_ANY);
  in->sin_port = htons(std::uint16_t(port));
  address.length = sizeof(sockaddr_in);
  return address;
}

SocketAddress advertised_address(int port) {
  SocketAddress address = any_address(port);
  auto *in = reinterpret_cast<sockaddr_in *>(&address.storage);
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ifaddrs *list = nullptr;
  if (getifaddrs(&list) != 0) return address;
  for (const ifaddrs *i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    in->sin_addr = reinterpret_cast<const sockaddr_in *>(i->ifa_addr)->sin_addr;
    break;
  }
  freeifaddrs(list);
  return address;
}

}  // namespace flatmem::comm::ucx
