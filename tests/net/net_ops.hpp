// The operations net_rank runs between network namespaces: each one is a
// collective call of every rank over one communicator, with a hash of its
// results (to compare runs over different networks bit for bit) and a check
// against a reference this rank computes by itself.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace net {

// A failed flatmem call: "<call>: <STATUS>: <flatmem_last_error()>".
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void check(flatmem_status status, const char *call);

// FNV-1a over bytes, chained.
struct Hash {
  std::uint64_t value = 0xcbf29ce484222325ull;
  void add(const void *data, std::size_t bytes);
  template <typename T>
  void add(const std::vector<T> &v) { add(v.data(), v.size() * sizeof(T)); }
};

struct Context {
  flatmem_comm_t *comm = nullptr;
  int rank = 0, world = 1;
  std::uint64_t seed = 1;
};

class Op {
 public:
  virtual ~Op() = default;
  // The name the harness knows it by (all_reduce, ring_shift, ring_loss, cyclic).
  virtual const char *name() const = 0;
  // One collective run; throws Failure.
  virtual void run() = 0;
  // Hash of what the last run produced on this rank.
  virtual std::uint64_t hash() const = 0;
  // The last run against this rank's own reference: "" or what differs.
  virtual std::string verify() const = 0;
};

// Called by the cyclic op after each action (the fault mode reports progress).
using Progress = std::function<void(const flatmem_cyclic_action &)>;

struct Sizes {
  std::int64_t all_reduce_elements = 1 << 16, shift_bytes = 256 << 10;
  std::int64_t batch = 256, d = 32;     // ring loss: global batch (symmetric), features
  std::int64_t cyclic_steps = 6;
};

// All four, in the order net_rank runs them.
std::vector<std::unique_ptr<Op>> make_ops(const Context &context, const Sizes &sizes,
                                          const Progress &progress = nullptr);

}  // namespace net
