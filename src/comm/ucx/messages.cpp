#include "comm/ucx/messages.hpp"

#include <cstring>

namespace flatmem::comm::ucx {
namespace {

enum Magic : std::uint32_t { hello_magic = 0x464c4d48, roster_magic = 0x464c4d52, reject_magic = 0x464c4d58 };

class Writer {
 public:
  template <typename T>
  Writer &put(const T &value) {
    const auto *p = reinterpret_cast<const char *>(&value);
    bytes.insert(bytes.end(), p, p + sizeof value);
    return *this;
  }
  Writer &put_bytes(const char *data, std::size_t n) {
    put(std::uint32_t(n));
    bytes.insert(bytes.end(), data, data + n);
    return *this;
  }
  std::vector<char> bytes;
};

class Reader {
 public:
  Reader(const std::vector<char> &b, std::size_t length) : data(b.data()), end(std::min(length, b.size())) {}
  template <typename T>
  bool get(T *value) {
    if (end - at < sizeof(T)) return false;
    std::memcpy(value, data + at, sizeof(T));
    at += sizeof(T);
    return true;
  }
  bool get_bytes(std::vector<char> *out) {
    std::uint32_t n;
    if (!get(&n) || end - at < n) return false;
    out->assign(data + at, data + at + n);
    at += n;
    return true;
  }
  bool header(std::uint32_t magic) {
    std::uint32_t m, version;
    return get(&m) && m == magic && get(&version) && version == FLATMEM_VERSION;
  }
  const char *data;
  std::size_t at = 0, end;
};

}  // namespace

std::vector<char> encode(const Hello &h) {
  Writer w;
  w.put(std::uint32_t(hello_magic)).put(std::uint32_t(FLATMEM_VERSION)).put(h.session).put(h.rank).put(h.world);
  w.put_bytes(h.address.data(), h.address.size());
  return w.bytes;
}

std::vector<char> encode(const std::vector<std::vector<char>> &roster) {
  Writer w;
  w.put(std::uint32_t(roster_magic)).put(std::uint32_t(FLATMEM_VERSION)).put(std::int32_t(roster.size()));
  for (const auto &address : roster) w.put_bytes(address.data(), address.size());
  return w.bytes;
}

std::vector<char> encode(const Reject &r) {
  Writer w;
  w.put(std::uint32_t(reject_magic)).put(std::uint32_t(FLATMEM_VERSION)).put(std::int32_t(r.status));
  w.put_bytes(r.reason.data(), r.reason.size());
  return w.bytes;
}

bool decode(const std::vector<char> &bytes, std::size_t length, Hello *h) {
  Reader r(bytes, length);
  return r.header(hello_magic) && r.get(&h->session) && r.get(&h->rank) && r.get(&h->world) &&
         r.get_bytes(&h->address);
}

bool decode(const std::vector<char> &bytes, std::size_t length, std::vector<std::vector<char>> *roster) {
  Reader r(bytes, length);
  std::int32_t n;
  if (!r.header(roster_magic) || !r.get(&n) || n < 1) return false;
  roster->assign(std::size_t(n), {});
  for (auto &address : *roster)
    if (!r.get_bytes(&address)) return false;
  return true;
}

bool decode(const std::vector<char> &bytes, std::size_t length, Reject *out) {
  Reader r(bytes, length);
  std::int32_t status;
  std::vector<char> text;
  if (!r.header(reject_magic) || !r.get(&status) || !r.get_bytes(&text)) return false;
  out->status = flatmem_status(status);
  out->reason.assign(text.begin(), text.end());
  return true;
}

}  // namespace flatmem::comm::ucx
