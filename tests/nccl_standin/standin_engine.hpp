// The matching engine of flatmem's NCCL stand-in (tests only; see
// docs/nccl-stand-in.md). It is not NCCL: it lets several ranks that
// are threads of one process exchange data on one device, in NCCL's order
// semantics, so that flatmem's side of the device transport (schedules,
// streams, events, offsets) runs with more than one rank on a one-GPU machine.
//
// Plain C++: the data moves through an Executor (CUDA events and device copies
// in the stand-in library, memcpy in the CPU unit test).
//
// Semantics:
//  - A clique is the ranks that share one unique id; a Comm is one rank of it.
//  - Point to point: the k-th send from rank a to rank b matches the k-th
//    receive on b from a; the byte counts must agree (else the clique fails).
//    A send stages its bytes (a copy on its own stream) and is done when
//    posted, as an NCCL send returns once enqueued; the receive copies from
//    the stage on its stream after the sender's stream has staged them.
//  - All-reduce (sum): the k-th all-reduce of every rank of the clique meet;
//    rank 0's thread sums the send buffers in rank order (((s0 + s1) + s2) ...)
//    into its recv buffer and copies that to every other rank's recv buffer
//    (in place allowed); count and type must agree.
//  - A group (Group::start ... Group::end, per thread, nestable) posts all of
//    its operations first and then completes them (a Batch), so a ring
//    exchange with a send and a receive in one group cannot deadlock. A call
//    outside a group is a batch of one. Completion blocks its thread until the
//    peers have posted (a receive: the matching send; an all-reduce: every
//    rank's part, and then, but on rank 0, rank 0's reduction); the stand-in
//    library completes on a thread of its own and answers ncclInProgress
//    meanwhile, as a non-blocking NCCL communicator does.
//  - Every wait ends at the comm's deadline: a peer that never posts, or a
//    mismatch, becomes an error, never a hang. Any error poisons the clique:
//    every rank's waits end and later calls fail. Comm::abort does the same.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nccl_standin {

enum class Result { success, invalid_argument, invalid_usage, timeout, peer_failed, executor_failed };

struct Status {
  Result result = Result::success;
  std::string message;  // empty on success
  bool ok() const { return result == Result::success; }
};

enum class ElementType { i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64 };
std::size_t element_size(ElementType type);
const char *element_name(ElementType type);

// An executor's marker in a stream (a CUDA event); the stream argument is the
// caller's stream (a cudaStream_t), opaque here. Executors throw
// std::exception on failure.
using Token = void *;

class Executor {
 public:
  virtual ~Executor() = default;
  // A marker after the work issued so far on `stream`.
  virtual Token mark(void *stream) = 0;
  // Later work on `stream` waits for `token`.
  virtual void wait(void *stream, Token token) = 0;
  // Drops a token (after every wait on it was issued).
  virtual void release(Token token) = 0;
  virtual void copy(void *dst, const void *src, std::size_t bytes, void *stream) = 0;
  // A copy of `bytes` (> 0) at `src`, made by work on `stream`; `drop` frees it
  // after the work issued so far on (another) `stream`.
  virtual void *stage(const void *src, std::size_t bytes, void *stream) = 0;
  virtual void drop(void *staged, void *stream) = 0;
  // dst[i] += src[i] for i < count.
  virtual void add(void *dst, const void *src, std::size_t count, ElementType type, void *stream) = 0;
};

// The executor of the stand-in library's calls (cuda_executor.cu; a host one
// in the CPU test of the C entry points).
Executor &library_executor();

class Clique;

// One rank of a clique. Thread-compatible: one thread calls a Comm at a time
// (as with NCCL); different Comms of a clique on different threads.
class Comm {
 public:
  // Joins (or opens) the clique of `key`; fails when nranks differ from the
  // clique's or the rank is taken.
  static std::unique_ptr<Comm> join(const std::string &key, int nranks, int rank, Executor &executor,
                                    std::chrono::milliseconds deadline, Status &status);
  ~Comm();
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;

  int rank() const { return rank_; }
  int size() const;
  // success, or the error that poisoned the clique.
  Status health() const;
  // Poisons the clique ("rank r aborted"): every waiter wakes with an error.
  void abort();
  std::chrono::milliseconds deadline() const { return deadline_; }
  Executor &executor() const { return executor_; }
  Clique &clique() const { return *clique_; }

 private:
  Comm(std::shared_ptr<Clique> clique, int rank, Executor &executor, std::chrono::milliseconds deadline);
  std::shared_ptr<Clique> clique_;
  int rank_;
  Executor &executor_;
  std::chrono::milliseconds deadline_;
};

struct Op {
  enum class Kind { send, recv, all_reduce } kind = Kind::send;
  Comm *comm = nullptr;
  const void *send = nullptr;  // send, all_reduce
  void *recv = nullptr;        // recv, all_reduce
  std::size_t count = 0;       // elements of `type`
  ElementType type = ElementType::u8;
  int peer = -1;  // send, recv
  void *stream = nullptr;
};

struct Posted;  // an op after its post (standin_engine.cpp)

// Ops posted together: posted in order on the calling thread (so that a
// rank's sequence numbers follow its calls), completed on any thread.
class Batch {
 public:
  // Checks every op (an argument error posts nothing and poisons nothing),
  // then posts them; `batch` is null when nothing was posted.
  static Status post(std::vector<Op> ops, std::unique_ptr<Batch> &batch);
  ~Batch();
  Batch(const Batch &) = delete;
  Batch &operator=(const Batch &) = delete;
  // Blocks until every op is matched and its work issued (the order
  // described above), or the deadline or a failure of a clique.
  Status complete();
  // Whether complete() may wait for other ranks (anything but sends).
  bool waits() const;

 private:
  explicit Batch(std::vector<Op> ops);
  std::vector<Op> ops_;
  std::vector<Posted> posted_;
};

// Posts and completes on the calling thread.
Status run_ops(std::vector<Op> ops);

// The calling thread's group (NCCL groups are per thread, and nest).
class Group {
 public:
  static void start();
  // Closes the innermost group; the outermost hands what it collected to
  // `ops` (else `ops` is left empty). invalid_usage when no group is open.
  static Status end(std::vector<Op> &ops);
  // Inside a group: checks and collects `op`, true. Outside: false.
  static bool collect(const Op &op, Status &status);
  static int depth();
};

}  // namespace nccl_standin
