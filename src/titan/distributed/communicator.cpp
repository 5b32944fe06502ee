#include "titan/distributed/communicator.h"

#include <cstring>

#include "titan/core/error.h"

namespace titan {
namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_reduce_sum(double*, int64_t) override {}
  void all_reduce_max(double*, int64_t) override {}
  CommHandle all_gather_async(std::vector<CommPart> parts) override {
    for (const CommPart& p : parts) copy(p.whole, p.own, p);
    return {};
  }
  CommHandle gather_async(std::vector<CommPart> parts, int root) override {
    TITAN_CHECK(root == 0, "gather to rank ", root, " in a group of one rank");
    for (const CommPart& p : parts) copy(p.whole, p.own, p);
    return {};
  }
  CommHandle reduce_scatter_sum_async(std::vector<CommPart> parts) override {
    for (const CommPart& p : parts) copy(p.own, p.whole, p);
    return {};
  }
  CommHandle all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                void* recv, const std::vector<int64_t>& recv_counts,
                                DType dtype) override {
    TITAN_CHECK(send_counts.size() == 1 && recv_counts.size() == 1, "all_to_all_v: counts for ",
                send_counts.size(), " and ", recv_counts.size(), " ranks in a group of one rank");
    TITAN_CHECK(send_counts[0] == recv_counts[0], "all_to_all_v: ", send_counts[0],
                " elements sent to this rank but ", recv_counts[0], " received");
    TITAN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::i32,
                "all_to_all_v: elements in ", dtype_name(dtype));
    const size_t bytes = static_cast<size_t>(send_counts[0]) * dtype_size(dtype);
    if (bytes > 0 && recv != send) std::memmove(recv, send, bytes);
    return {};
  }
  std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send_counts) override {
    TITAN_CHECK(send_counts.size() == 1, "all_to_all_counts: counts for ", send_counts.size(),
                " ranks in a group of one rank");
    return send_counts;
  }
  void broadcast(float*, int64_t, int root) override {
    TITAN_CHECK(root == 0, "broadcast from rank ", root, " in a group of one rank");
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SingleRankCommunicator>();
  }

 private:
  static void copy(void* out, const void* in, const CommPart& p) {
    TITAN_CHECK(p.counts.size() == 1, "a collective part cut for ", p.counts.size(),
                " ranks in a group of one rank");
    const size_t bytes = static_cast<size_t>(p.counts[0]) * dtype_size(p.dtype);
    if (out != in) std::memmove(out, in, bytes);
  }
};

}  // namespace

int64_t Communicator::whole_bytes(const std::vector<CommPart>& parts) {
  int64_t bytes = 0;
  for (const CommPart& p : parts) {
    for (const int64_t n : p.counts) bytes += n * static_cast<int64_t>(dtype_size(p.dtype));
  }
  return bytes;
}

std::unique_ptr<Communicator> make_single_rank_communicator() {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace titan
