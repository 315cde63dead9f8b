// The in-process communicator group behind flatmem_comm_create_local: one
// LocalCommunicator per rank, all sharing one LocalGroup (mailboxes, poison
// state; see local_group.hpp). Messages are copied between the ranks'
// buffers; the collectives come from the Communicator base, as for UCX.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/local/local_group.hpp"

namespace flatmem::comm::local {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank);
  ~LocalCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  Milliseconds default_timeout() const override { return group_->default_timeout(); }

  void check_healthy() const override { group_->check_healthy(rank_); }
  flatmem_status health(std::string *message) const override {
    return group_->health(rank_, message);
  }
  void poison(flatmem_status status, const std::string &message) override {
    group_->poison(rank_, status, message);
  }

  TransferPtr send(int peer, const void *data, std::size_t bytes, Space space,
                   std::uint64_t tag) override;
  TransferPtr recv(int peer, void *data, std::size_t bytes, Space space,
                   std::uint64_t tag) override;
  void wait(const TransferPtr &transfer, Milliseconds timeout, const std::string &what) override;
  bool test(const TransferPtr &transfer) override;

  std::uint64_t next_sequence() override { return ++sequence_; }

 private:
  void check_peer(int peer, const char *operation) const;

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::uint64_t sequence_ = 0;
};

// world_size communicators of one new group; element r is rank r.
std::vector<std::unique_ptr<Communicator>> create_group(int world_size,
                                                        Milliseconds default_timeout);

}  // namespace flatmem::comm::local
