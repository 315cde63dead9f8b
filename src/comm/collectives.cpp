// Host collectives written once over send / recv / wait, for every transport.
// Large payloads go round rings: each step talks only to the two neighbours,
// so the bytes per rank do not grow with the number of ranks. Small ones
// (all_gather and all_reduce_sum of at most kDirectBytes in all) are one
// direct exchange instead: every rank sends its part to every other rank at
// once, so the operation costs one network latency rather than n - 1 (or
// 2(n - 1)) in sequence -- the ring loss's argument agreement and its two
// one-double sums cost 18 sequential hops per step at 4 ranks before, half of
// a step on a 20 ms link -- and a dead rank is noticed by every rank that
// waits on it directly.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace flatmem::comm {
namespace {

std::size_t sum_type_bytes(SumType type) {
  switch (type) {
    case SumType::f32:
    case SumType::i32: return 4;
    case SumType::f64:
    case SumType::i64: return 8;
  }
  return 0;
}

template <typename T>
void add_elements(void *into, const void *from, std::size_t count) {
  auto *a = static_cast<T *>(into);
  const auto *b = static_cast<const T *>(from);
  for (std::size_t i = 0; i < count; ++i) a[i] = a[i] + b[i];
}


// "<what> (#seq), step s of n: "
std::string step_label(const std::string &what, std::uint64_t sequence, int step, int steps) {
  return what + " (#" + std::to_string(sequence) + "), step " + std::to_string(step + 1) + " of " +
         std::to_string(steps);
}

int mod(int a, int n) { return ((a % n) + n) % n; }

// Payloads of all_gather / all_reduce_sum up to this many bytes in all (the
// parts of every rank together), among at most kDirectRanks ranks, take the
// direct exchange. Both are the same on every rank (they depend on sizes the
// ranks must agree on), so every rank picks the same algorithm.
constexpr std::size_t kDirectBytes = 64 * 1024;
constexpr int kDirectRanks = 64;

bool direct_exchange(int n, std::size_t bytes_per_rank) {
  return n <= kDirectRanks && bytes_per_rank <= kDirectBytes / std::size_t(n);
}

}  // namespace

void add_into(SumType type, void *into, const void *from, std::size_t count) {
  switch (type) {
    case SumType::f32: return add_elements<float>(into, from, count);
    case SumType::f64: return add_elements<double>(into, from, count);
    case SumType::i32: return add_elements<std::int32_t>(into, from, count);
    case SumType::i64: return add_elements<std::int64_t>(into, from, count);
  }
}

void Communicator::wait_all(std::span<const TransferPtr> transfers, Milliseconds timeout,
                            const std::string &what) {
  for (const TransferPtr &t : transfers) {
    try {
      wait(t, timeout, what);
    } catch (const Error &e) {
      poison(e.status(), e.what());
      throw;
    }
  }
}

void Communicator::ring_shift(const void *send_data, void *recv_data, std::size_t bytes,
                              Milliseconds timeout, const std::string &what) {
  check_healthy();
  const std::uint64_t sequence = next_sequence();
  if (size() == 1) {
    if (bytes) std::memmove(recv_data, send_data, bytes);
    return;
  }
  const int n = size(), r = rank();
  const std::uint64_t tag = internal_tag(sequence, 0);
  TransferPtr in = recv(mod(r - 1, n), recv_data, bytes, Space::internal, tag);
  TransferPtr out = send(mod(r + 1, n), send_data, bytes, Space::internal, tag);
  wait_all({in, out}, timeout, step_label(what, sequence, 0, 1));
}

void Communicator::all_gather(const void *mine, void *all, std::size_t bytes, Milliseconds timeout,
                              const std::string &what) {
  check_healthy();
  const std::uint64_t sequence = next_sequence();
  const int n = size(), r = rank();
  auto *blocks = static_cast<char *>(all);
  if (bytes) std::memmove(blocks + std::size_t(r) * bytes, mine, bytes);
  if (n == 1) return;
  if (direct_exchange(n, bytes)) {
    exchange_with_all(blocks, bytes, timeout, internal_tag(sequence, 0),
                      what + " (#" + std::to_string(sequence) + "), direct exchange");
    return;
  }
  // Step s passes on the block that originated at rank r - s.
  for (int s = 0; s + 1 < n; ++s) {
    const std::size_t out_block = std::size_t(mod(r - s, n)), in_block = std::size_t(mod(r - s - 1, n));
    const std::uint64_t tag = internal_tag(sequence, std::uint32_t(s));
    TransferPtr in = recv(mod(r - 1, n), blocks + in_block * bytes, bytes, Space::internal, tag);
    TransferPtr out = send(mod(r + 1, n), blocks + out_block * bytes, bytes, Space::internal, tag);
    wait_all({in, out}, timeout, step_label(what, sequence, s, n - 1));
  }
}

void Communicator::exchange_with_all(char *blocks, std::size_t bytes, Milliseconds timeout,
                                     std::uint64_t tag, const std::string &what) {
  const int n = size(), r = rank();
  std::vector<TransferPtr> transfers;
  transfers.reserve(2 * std::size_t(n - 1));
  // Receives first, then sends, both in the order r + 1, r + 2, ... so that
  // no rank's messages all target the same peer first.
  for (int k = 1; k < n; ++k) {
    const int peer = mod(r + k, n);
    transfers.push_back(recv(peer, blocks + std::size_t(peer) * bytes, bytes, Space::internal, tag));
  }
  for (int k = 1; k < n; ++k)
    transfers.push_back(send(mod(r - k, n), blocks + std::size_t(r) * bytes, bytes, Space::internal, tag));
  wait_all(transfers, timeout, what);
}

void Communicator::broadcast(void *data, std::size_t bytes, int root, Milliseconds timeout,
                             const std::string &what) {
  check_healthy();
  const std::uint64_t sequence = next_sequence();
  const int n = size();
  const std::uint64_t tag = internal_tag(sequence, 0);
  if (rank() != root) {
    wait_all({recv(root, data, bytes, Space::internal, tag)}, timeout,
             step_label(what, sequence, 0, 1));
    return;
  }
  std::vector<TransferPtr> sends;
  for (int peer = 0; peer < n; ++peer)
    if (peer != root) sends.push_back(send(peer, data, bytes, Space::internal, tag));
  for (std::size_t i = 0; i < sends.size(); ++i)
    wait_all({sends[i]}, timeout, step_label(what, sequence, int(i), int(sends.size())));
}

void Communicator::barrier(Milliseconds timeout, const std::string &what) {
  // After the all-gather (one byte each: the direct exchange) every rank has
  // heard from every other rank: all of them have entered.
  std::vector<char> all(static_cast<std::size_t>(size()));
  const char mine = 1;
  all_gather(&mine, all.data(), 1, timeout, what);
}

void Communicator::all_reduce_sum(const void *send_data, void *recv_data, std::size_t count,
                                  SumType type, Milliseconds timeout, const std::string &what) {
  check_healthy();
  const std::uint64_t sequence = next_sequence();
  const int n = size();
  const std::size_t bytes = count * sum_type_bytes(type);
  if (n > 1 && direct_exchange(n, bytes)) {
    // Everyone's part, then the sum in rank order 0, 1, ..., n - 1 on every
    // rank: the same bits everywhere.
    std::vector<char> parts(std::size_t(n) * bytes);
    if (bytes) std::memcpy(parts.data() + std::size_t(rank()) * bytes, send_data, bytes);
    exchange_with_all(parts.data(), bytes, timeout, internal_tag(sequence, 0),
                      what + " (#" + std::to_string(sequence) + "), direct exchange");
    if (!bytes) return;
    std::memcpy(recv_data, parts.data(), bytes);
    for (int p = 1; p < n; ++p) add_into(type, recv_data, parts.data() + std::size_t(p) * bytes, count);
    return;
  }
  all_reduce_sum_tagged(send_data, recv_data, count, type, timeout,
                        what + " (#" + std::to_string(sequence) + ")", Space::internal,
                        internal_tag(sequence, 0));
}

void Communicator::all_reduce_sum_tagged(const void *send_data, void *recv_data, std::size_t count,
                                         SumType type, Milliseconds timeout,
                                         const std::string &what, Space space,
                                         std::uint64_t tag_base) {
  check_healthy();
  const std::size_t element = sum_type_bytes(type);
  if (send_data != recv_data && count) std::memmove(recv_data, send_data, count * element);
  const int n = size(), r = rank();
  if (n == 1) return;
  auto *data = static_cast<char *>(recv_data);
  // Chunk c covers elements [c * count / n, (c + 1) * count / n).
  const auto chunk_begin = [&](int c) { return std::size_t(c) * count / std::size_t(n); };
  const auto chunk_count = [&](int c) { return chunk_begin(c + 1) - chunk_begin(c); };
  std::vector<char> incoming((count / std::size_t(n) + 1) * element);
  const int steps = 2 * (n - 1);
  const auto label = [&](int step) {
    return what + ", step " + std::to_string(step + 1) + " of " + std::to_string(steps);
  };

  // Reduce-scatter: chunk c starts at rank c and gains one rank per step, in
  // ring order, so its sum is formed in the same order on every run; after
  // n - 1 steps rank r holds the total of chunk r + 1.
  for (int s = 0; s + 1 < n; ++s) {
    const int out_chunk = mod(r - s, n), in_chunk = mod(r - s - 1, n);
    const std::uint64_t tag = tag_base + std::uint64_t(s);
    TransferPtr in = recv(mod(r - 1, n), incoming.data(), chunk_count(in_chunk) * element, space, tag);
    TransferPtr out = send(mod(r + 1, n), data + chunk_begin(out_chunk) * element,
                           chunk_count(out_chunk) * element, space, tag);
    wait_all({in, out}, timeout, label(s));
    add_into(type, data + chunk_begin(in_chunk) * element, incoming.data(), chunk_count(in_chunk));
  }
  // All-gather of the totals: everyone ends with the same bits.
  for (int s = 0; s + 1 < n; ++s) {
    const int out_chunk = mod(r + 1 - s, n), in_chunk = mod(r - s, n);
    const std::uint64_t tag = tag_base + std::uint64_t(n + s);
    TransferPtr in = recv(mod(r - 1, n), data + chunk_begin(in_chunk) * element,
                          chunk_count(in_chunk) * element, space, tag);
    TransferPtr out = send(mod(r + 1, n), data + chunk_begin(out_chunk) * element,
                           chunk_count(out_chunk) * element, space, tag);
    wait_all({in, out}, timeout, label(n - 1 + s));
  }
}

}  // namespace flatmem::comm
