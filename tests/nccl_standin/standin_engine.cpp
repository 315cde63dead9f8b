#include "nccl_standin/standin_engine.hpp"

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace nccl_standin {

std::size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::i8:
    case ElementType::u8: return 1;
    case ElementType::f16:
    case ElementType::bf16: return 2;
    case ElementType::i32:
    case ElementType::u32:
    case ElementType::f32: return 4;
    case ElementType::i64:
    case ElementType::u64:
    case ElementType::f64: return 8;
  }
  return 0;
}

const char *element_name(ElementType type) {
  switch (type) {
    case ElementType::i8: return "int8";
    case ElementType::u8: return "uint8";
    case ElementType::i32: return "int32";
    case ElementType::u32: return "uint32";
    case ElementType::i64: return "int64";
    case ElementType::u64: return "uint64";
    case ElementType::f16: return "fp16";
    case ElementType::bf16: return "bf16";
    case ElementType::f32: return "fp32";
    case ElementType::f64: return "fp64";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

// One send, from its post until the receiver has issued its copy.
struct Transfer {
  void *staged = nullptr;  // the sent bytes (NULL for 0 bytes)
  std::size_t bytes = 0;
  Token sent = nullptr;  // on the sender's stream: `staged` holds them
};

// Sends from one rank to another, in order.
struct Channel {
  std::uint64_t sends = 0, receives = 0;  // posted so far (the next sequence numbers)
  std::map<std::uint64_t, std::shared_ptr<Transfer>> unmatched;
};

// One rank's part of an all-reduce.
struct Contribution {
  const void *send = nullptr;
  void *recv = nullptr;
  std::size_t count = 0;
  ElementType type = ElementType::f32;
  Token ready = nullptr;
};

// The k-th all-reduce of the clique.
struct Meeting {
  std::vector<std::optional<Contribution>> parts;
  int posted = 0, collected = 0;
  bool reduced = false;
  std::vector<Token> done;  // per rank: rank 0's reduction has written its recv
};

}  // namespace

class Clique {
 public:
  explicit Clique(int n) : nranks(n), taken(std::size_t(n), false), channels(std::size_t(n) * std::size_t(n)),
                           reduces(std::size_t(n), 0) {}
  const int nranks;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> taken;
  Status failure;  // the first error (the clique is poisoned when set)
  std::vector<Channel> channels;
  std::vector<std::uint64_t> reduces;  // all-reduces posted per rank
  std::map<std::uint64_t, Meeting> meetings;

  Channel &channel(int from, int to) { return channels[std::size_t(from) * std::size_t(nranks) + std::size_t(to)]; }

  // Poisons the clique (first reason wins) and returns what the caller reports.
  Status fail(Result result, const std::string &message) {
    if (failure.ok()) failure = Status{result, message};
    changed.notify_all();
    return Status{result, message};
  }
  Status poisoned() const { return Status{Result::peer_failed, "the clique failed earlier: " + failure.message}; }

  // Waits (lock held) until `ready()`, the clique fails or `deadline` passes.
  template <typename Ready>
  Status wait(std::unique_lock<std::mutex> &lock, Clock::time_point deadline, std::chrono::milliseconds limit,
              const std::string &what, Ready ready) {
    for (;;) {
      if (!failure.ok()) return poisoned();
      if (ready()) return {};
      if (changed.wait_until(lock, deadline) != std::cv_status::timeout) continue;
      if (!failure.ok()) return poisoned();
      if (ready()) return {};
      return fail(Result::timeout, what + ": not matched within the stand-in's deadline of " +
                                       std::to_string(limit.count()) + " ms");
    }
  }
};

namespace {

std::mutex registry_mutex;
std::map<std::string, std::weak_ptr<Clique>> &registry() {
  static std::map<std::string, std::weak_ptr<Clique>> cliques;
  return cliques;
}

}  // namespace

// --- Comm ------------------------------------------------------------------------------

std::unique_ptr<Comm> Comm::join(const std::string &key, int nranks, int rank, Executor &executor,
                                 std::chrono::milliseconds deadline, Status &status) {
  status = {};
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    status = {Result::invalid_argument, "rank " + std::to_string(rank) + " of " + std::to_string(nranks)};
    return nullptr;
  }
  std::lock_guard<std::mutex> guard(registry_mutex);
  std::shared_ptr<Clique> clique = registry()[key].lock();
  if (!clique) {
    clique = std::make_shared<Clique>(nranks);
    registry()[key] = clique;
  }
  std::lock_guard<std::mutex> lock(clique->mutex);
  if (clique->nranks != nranks) {
    status = {Result::invalid_argument, "nranks " + std::to_string(nranks) + " but the clique of this unique id has " +
                                            std::to_string(clique->nranks)};
    return nullptr;
  }
  if (clique->taken[std::size_t(rank)]) {
    status = {Result::invalid_usage, "rank " + std::to_string(rank) + " joined this unique id twice"};
    return nullptr;
  }
  clique->taken[std::size_t(rank)] = true;
  return std::unique_ptr<Comm>(new Comm(std::move(clique), rank, executor, deadline));
}

Comm::Comm(std::shared_ptr<Clique> clique, int rank, Executor &executor, std::chrono::milliseconds deadline)
    : clique_(std::move(clique)), rank_(rank), executor_(executor), deadline_(deadline) {}

Comm::~Comm() = default;

int Comm::size() const { return clique_->nranks; }

Status Comm::health() const {
  std::lock_guard<std::mutex> lock(clique_->mutex);
  return clique_->failure.ok() ? Status{} : clique_->poisoned();
}

void Comm::abort() {
  std::lock_guard<std::mutex> lock(clique_->mutex);
  clique_->fail(Result::peer_failed, "rank " + std::to_string(rank_) + " aborted its communicator");
}

// --- batches and groups ----------------------------------------------------------------

// An op after its post: what its completion needs.
struct Posted {
  const Op *op = nullptr;
  std::uint64_t sequence = 0;
  Clock::time_point deadline;
};

namespace {

struct ThreadGroup {
  int depth = 0;
  std::vector<Op> ops;
};
thread_local ThreadGroup this_thread_group;

std::string op_name(const Op &op, std::uint64_t sequence) {
  const std::string me = std::to_string(op.comm->rank()), peer = std::to_string(op.peer);
  switch (op.kind) {
    case Op::Kind::send: return "send #" + std::to_string(sequence) + " from rank " + me + " to rank " + peer;
    case Op::Kind::recv: return "receive #" + std::to_string(sequence) + " on rank " + me + " from rank " + peer;
    case Op::Kind::all_reduce: return "all-reduce #" + std::to_string(sequence) + " on rank " + me;
  }
  return "?";
}

Status check(const Op &op) {
  if (op.comm == nullptr) return {Result::invalid_argument, "no communicator"};
  if (op.kind != Op::Kind::all_reduce && (op.peer < 0 || op.peer >= op.comm->size()))
    return {Result::invalid_argument, "peer " + std::to_string(op.peer) + " is out of range (" +
                                          std::to_string(op.comm->size()) + " ranks)"};
  const bool reads = op.kind != Op::Kind::recv, writes = op.kind != Op::Kind::send;
  if (op.count > 0 && ((reads && op.send == nullptr) || (writes && op.recv == nullptr)))
    return {Result::invalid_argument, "a null buffer"};
  return {};
}

void post_op(Posted &p, Clique &c) {
  const Op &op = *p.op;
  const int me = op.comm->rank();
  switch (op.kind) {
    case Op::Kind::send: {
      Channel &ch = c.channel(me, op.peer);
      p.sequence = ch.sends++;
      auto t = std::make_shared<Transfer>();
      t->bytes = op.count * element_size(op.type);
      if (t->bytes > 0) t->staged = op.comm->executor().stage(op.send, t->bytes, op.stream);
      t->sent = op.comm->executor().mark(op.stream);
      ch.unmatched[p.sequence] = std::move(t);
      break;
    }
    case Op::Kind::recv: p.sequence = c.channel(op.peer, me).receives++; break;
    case Op::Kind::all_reduce: {
      p.sequence = c.reduces[std::size_t(me)]++;
      Meeting &m = c.meetings[p.sequence];
      if (m.parts.empty()) {
        m.parts.resize(std::size_t(c.nranks));
        m.done.resize(std::size_t(c.nranks), nullptr);
      }
      m.parts[std::size_t(me)] = Contribution{op.send, op.recv, op.count, op.type, op.comm->executor().mark(op.stream)};
      ++m.posted;
      break;
    }
  }
  c.changed.notify_all();
}

Status complete_recv(const Posted &p, Clique &c, std::unique_lock<std::mutex> &lock) {
  const Op &op = *p.op;
  const std::string what = op_name(op, p.sequence);
  Channel &ch = c.channel(op.peer, op.comm->rank());
  Status s = c.wait(lock, p.deadline, op.comm->deadline(), what + " (rank " + std::to_string(op.peer) + " has posted " +
                                                                 std::to_string(ch.sends) + " sends to it)",
                    [&] { return ch.unmatched.count(p.sequence) > 0; });
  if (!s.ok()) return s;
  const std::shared_ptr<Transfer> t = ch.unmatched[p.sequence];
  ch.unmatched.erase(p.sequence);
  const std::size_t bytes = op.count * element_size(op.type);
  Executor &x = op.comm->executor();
  x.wait(op.stream, t->sent);
  x.release(t->sent);
  if (t->bytes == bytes && bytes > 0) x.copy(op.recv, t->staged, bytes, op.stream);
  if (t->staged != nullptr) x.drop(t->staged, op.stream);
  if (t->bytes != bytes)
    return c.fail(Result::invalid_usage, what + " expects " + std::to_string(bytes) + " bytes but the matching send has " +
                                             std::to_string(t->bytes));
  return {};
}

// Rank 0: sums every rank's send buffer into its recv and copies that out.
Status reduce(const Posted &p, Clique &c, std::unique_lock<std::mutex> &lock) {
  const Op &op = *p.op;
  const std::string what = op_name(op, p.sequence);
  Meeting &m = c.meetings[p.sequence];
  Status s = c.wait(lock, p.deadline, op.comm->deadline(),
                    what + " (" + std::to_string(m.posted) + " of " + std::to_string(c.nranks) + " ranks posted it)",
                    [&] { return m.posted == c.nranks; });
  if (!s.ok()) return s;
  for (int r = 1; r < c.nranks; ++r) {
    const Contribution &x = *m.parts[std::size_t(r)];
    if (x.count != op.count || x.type != op.type)
      return c.fail(Result::invalid_usage, what + ": rank 0 reduces " + std::to_string(op.count) + " " +
                                               element_name(op.type) + ", rank " + std::to_string(r) + " " +
                                               std::to_string(x.count) + " " + element_name(x.type));
  }
  Executor &x = op.comm->executor();
  for (const std::optional<Contribution> &part : m.parts) {
    x.wait(op.stream, part->ready);
    x.release(part->ready);
  }
  const std::size_t bytes = op.count * element_size(op.type);
  if (bytes > 0) {
    if (op.send != op.recv) x.copy(op.recv, op.send, bytes, op.stream);
    for (int r = 1; r < c.nranks; ++r) x.add(op.recv, m.parts[std::size_t(r)]->send, op.count, op.type, op.stream);
    for (int r = 1; r < c.nranks; ++r) x.copy(m.parts[std::size_t(r)]->recv, op.recv, bytes, op.stream);
  }
  for (int r = 1; r < c.nranks; ++r) m.done[std::size_t(r)] = x.mark(op.stream);
  m.reduced = true;
  if (c.nranks == 1) c.meetings.erase(p.sequence);
  c.changed.notify_all();
  return {};
}

Status collect_reduction(const Posted &p, Clique &c, std::unique_lock<std::mutex> &lock) {
  const Op &op = *p.op;
  Status s = c.wait(lock, p.deadline, op.comm->deadline(), op_name(op, p.sequence) + " (waiting for rank 0's sum)",
                    [&] { return c.meetings[p.sequence].reduced; });
  if (!s.ok()) return s;
  Meeting &m = c.meetings[p.sequence];
  Executor &x = op.comm->executor();
  x.wait(op.stream, m.done[std::size_t(op.comm->rank())]);
  x.release(m.done[std::size_t(op.comm->rank())]);
  if (++m.collected == c.nranks - 1) c.meetings.erase(p.sequence);
  return {};
}

// Completion first of what depends only on the peers' posts (receives, rank 0's
// reductions), then of what depends on another rank's completion.
bool first_wave(const Op &op) {
  return op.kind == Op::Kind::recv || (op.kind == Op::Kind::all_reduce && op.comm->rank() == 0);
}

Status complete_op(const Posted &p, Clique &c, std::unique_lock<std::mutex> &lock) {
  switch (p.op->kind) {
    case Op::Kind::send: return {};  // done when posted
    case Op::Kind::recv: return complete_recv(p, c, lock);
    case Op::Kind::all_reduce:
      return p.op->comm->rank() == 0 ? reduce(p, c, lock) : collect_reduction(p, c, lock);
  }
  return {};
}

// Runs `step` under the clique's lock; an executor's exception poisons the clique.
template <typename Step>
Status locked(Clique &c, Step step) {
  std::unique_lock<std::mutex> lock(c.mutex);
  try {
    return step(lock);
  } catch (const std::exception &e) {
    return c.fail(Result::executor_failed, e.what());
  }
}

}  // namespace

Batch::Batch(std::vector<Op> ops) : ops_(std::move(ops)), posted_(ops_.size()) {}
Batch::~Batch() = default;

Status Batch::post(std::vector<Op> ops, std::unique_ptr<Batch> &batch) {
  batch.reset();
  for (const Op &op : ops)
    if (Status s = check(op); !s.ok()) return s;
  std::unique_ptr<Batch> b(new Batch(std::move(ops)));
  for (std::size_t i = 0; i < b->ops_.size(); ++i) {
    Posted &p = b->posted_[i];
    p.op = &b->ops_[i];
    p.deadline = Clock::now() + p.op->comm->deadline();
    Clique &c = p.op->comm->clique();
    Status s = locked(c, [&](std::unique_lock<std::mutex> &) {
      if (!c.failure.ok()) return c.poisoned();
      post_op(p, c);
      return Status{};
    });
    if (!s.ok()) return s;
  }
  batch = std::move(b);
  return {};
}

Status Batch::complete() {
  for (const bool first : {true, false})
    for (const Posted &p : posted_) {
      if (first_wave(*p.op) != first) continue;
      Clique &c = p.op->comm->clique();
      if (Status s = locked(c, [&](std::unique_lock<std::mutex> &lock) { return complete_op(p, c, lock); }); !s.ok())
        return s;
    }
  return {};
}

bool Batch::waits() const {
  for (const Op &op : ops_)
    if (op.kind != Op::Kind::send) return true;
  return false;
}

Status run_ops(std::vector<Op> ops) {
  std::unique_ptr<Batch> batch;
  Status s = Batch::post(std::move(ops), batch);
  return s.ok() && batch ? batch->complete() : s;
}

void Group::start() { ++this_thread_group.depth; }

Status Group::end(std::vector<Op> &ops) {
  ops.clear();
  ThreadGroup &g = this_thread_group;
  if (g.depth == 0) return {Result::invalid_usage, "group end without a group start"};
  if (--g.depth == 0) ops.swap(g.ops);
  return {};
}

bool Group::collect(const Op &op, Status &status) {
  ThreadGroup &g = this_thread_group;
  if (g.depth == 0) return false;
  status = check(op);
  if (status.ok()) g.ops.push_back(op);
  return true;
}

int Group::depth() { return this_thread_group.depth; }

}  // namespace nccl_standin
