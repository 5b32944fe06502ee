#include "titan/dist/communicator.h"

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
  void all_gather(float* out, const float* in, int64_t count) override { copy(out, in, count); }
  void reduce_scatter_sum(float* out, const float* in, int64_t count) override {
    copy(out, in, count);
  }
  CommHandle all_gather_async(float* out, const float* in, int64_t count) override {
    copy(out, in, count);
    return {};
  }
  CommHandle reduce_scatter_sum_async(float* out, const float* in, int64_t count) override {
    copy(out, in, count);
    return {};
  }
  void broadcast(float*, int64_t, int root) override {
    TITAN_CHECK(root == 0, "broadcast from rank ", root, " in a group of one rank");
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SingleRankCommunicator>();
  }

 private:
  static void copy(float* out, const float* in, int64_t count) {
    if (out != in) std::memmove(out, in, static_cast<size_t>(count) * sizeof(float));
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator() {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace titan
