#include "pipesgd/sim/sim_transport.h"

#include <simgrid/Exception.hpp>
#include <simgrid/s4u.hpp>

#include <chrono>
#include <cstring>

#include "pipesgd/comm/wait.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace sg4 = simgrid::s4u;
namespace {

using Payload = std::vector<std::byte>;

class SimRequest : public RequestState {
 public:
  // A send: `comm` carries a payload the receiver owns once it arrives.
  SimRequest(SimFabric& fabric, sg4::CommPtr comm, const char* operation, int self, int peer, Tag tag)
      : fabric_(fabric), comm_(std::move(comm)), operation_(operation), self_(self), peer_(peer),
        tag_(tag) {}
  // A recv into `buffer`.
  SimRequest(SimFabric& fabric, const char* operation, int self, int peer, Tag tag, std::span<std::byte> buffer)
      : fabric_(fabric), operation_(operation), self_(self), peer_(peer), tag_(tag), buffer_(buffer),
        is_recv_(true) {}

  // Posts the recv (after construction: the mailbox writes the payload pointer into this object).
  void post_recv(sg4::Mailbox* mailbox) { comm_ = mailbox->get_async<Payload>(&payload_); }

  // SimGrid's own wait, in simulated time, with the errors of comm/wait.h: a failure reported before
  // the wait aborts it; a wait that outlasts `timeout` (simulated) times out.
  std::size_t wait(Timeout timeout) override {
    if (!done_) {
      if (fabric_.failed()) throw_wait_aborted(describe(), fabric_.failure());
      try {
        comm_->wait_for(std::chrono::duration<double>(timeout).count());
      } catch (const simgrid::TimeoutException&) {
        throw_wait_timed_out(describe(), timeout, peer_, " (simulated)");
      }
      finish();
    }
    return bytes_;
  }

  bool test() override {
    if (done_) return true;
    if (!comm_->test()) return false;
    finish();
    return true;
  }

  void cancel() override {
    if (done_ || !comm_) return;
    comm_->cancel();
    done_ = true;
  }

 private:
  std::string describe() const { return describe_message_wait(operation_, !is_recv_, peer_, tag_, self_); }

  void finish() {
    done_ = true;
    if (!is_recv_) return;
    std::unique_ptr<Payload> payload(payload_);
    PIPESGD_ASSERT(payload != nullptr);
    if (payload->size() > buffer_.size()) {
      throw CommError(concat(describe(), ": message of ", payload->size(), " bytes does not fit the ",
                             buffer_.size(), "-byte buffer"));
    }
    if (!payload->empty()) std::memcpy(buffer_.data(), payload->data(), payload->size());
    bytes_ = payload->size();
  }

  SimFabric& fabric_;
  sg4::CommPtr comm_;
  const char* operation_;
  int self_;
  int peer_;
  Tag tag_;
  std::span<std::byte> buffer_;
  bool is_recv_ = false;
  Payload* payload_ = nullptr;
  bool done_ = false;
  std::size_t bytes_ = 0;
};

class SimEndpoint : public Transport {
 public:
  SimEndpoint(SimFabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return fabric_.size(); }

  Request send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) override {
    check_peer(peer, operation);
    sg4::Mailbox* mailbox = mailbox_for(rank_, peer, tag);
    auto* payload = new Payload(bytes.begin(), bytes.end());  // owned by the receiver once it lands
    bytes_sent_ += bytes.size();
    auto comm = mailbox->put_async(payload, bytes.size());
    return Request(std::make_shared<SimRequest>(fabric_, std::move(comm), operation, rank_, peer, tag));
  }

  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    check_peer(peer, operation);
    auto state = std::make_shared<SimRequest>(fabric_, operation, rank_, peer, tag, buffer);
    state->post_recv(mailbox_for(peer, rank_, tag));
    return Request(std::move(state));
  }

  void report_failure(const std::string& reason) override { fabric_.report_failure(rank_, reason); }
  std::uint64_t bytes_sent() const override { return bytes_sent_; }
  std::string describe() const override { return concat("simulated, ", fabric_.size(), " ranks"); }

 private:
  void check_peer(int peer, const char* operation) const {
    if (peer < 0 || peer >= fabric_.size()) {
      throw UsageError(concat(operation, ": rank ", peer, " is not one of the ", fabric_.size(), " ranks"));
    }
  }

  sg4::Mailbox* mailbox_for(int from, int to, Tag tag) const {
    sg4::Mailbox* mailbox = sg4::Mailbox::by_name(concat(from, '>', to, '#', tag));
    if (fabric_.claim_mailbox(mailbox)) {
      sg4::Actor* receiver = fabric_.receiver(to);
      PIPESGD_ASSERT(receiver != nullptr);
      mailbox->set_receiver(receiver);
    }
    return mailbox;
  }

  SimFabric& fabric_;
  int rank_;
  std::uint64_t bytes_sent_ = 0;
};

}  // namespace

SimFabric::SimFabric(int ranks) : receivers_(static_cast<std::size_t>(ranks), nullptr) {
  PIPESGD_ASSERT(ranks >= 1);
  for (int r = 0; r < ranks; ++r) endpoints_.push_back(std::make_unique<SimEndpoint>(*this, r));
}

SimFabric::~SimFabric() = default;

void SimFabric::set_receiver(int rank, sg4::Actor* actor) { receivers_.at(static_cast<std::size_t>(rank)) = actor; }

sg4::Actor* SimFabric::receiver(int rank) const { return receivers_.at(static_cast<std::size_t>(rank)); }

void SimFabric::report_failure(int rank, const std::string& reason) { failure_.report(rank, reason); }

}  // namespace pipesgd
