// The communicator over UCX: ranks joined by the bootstrap, a full mesh of
// endpoints, host transfers through the engine's progress thread.
#pragma once

#include <atomic>
#include <memory>

#include "comm/communicator.hpp"
#include "comm/options.hpp"
#include "comm/ucx/engine.hpp"

namespace flatmem::comm::ucx {

class UcxCommunicator final : public Communicator {
 public:
  UcxCommunicator(int rank, int size, Config config, std::unique_ptr<Engine> engine);
  ~UcxCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Milliseconds default_timeout() const override { return config_.timeout; }
  void check_healthy() const override;
  flatmem_status health(std::string *message) const override;
  void poison(flatmem_status status, const std::string &message) override;

  TransferPtr send(int peer, const void *data, std::size_t bytes, Space space,
                   std::uint64_t tag) override;
  TransferPtr recv(int peer, void *data, std::size_t bytes, Space space,
                   std::uint64_t tag) override;
  void wait(const TransferPtr &transfer, Milliseconds timeout, const std::string &what) override;
  bool test(const TransferPtr &transfer) override;
  std::uint64_t next_sequence() override { return sequence_++; }

 private:
  std::uint64_t wire_tag(Space space, int source, std::uint64_t tag) const;
  [[noreturn]] void fail_after_poison(const UcxTransfer &t, const std::string &what);

  int rank_, size_;
  Config config_;
  std::unique_ptr<Engine> engine_;
  std::uint64_t sequence_ = 1;
};

}  // namespace flatmem::comm::ucx
