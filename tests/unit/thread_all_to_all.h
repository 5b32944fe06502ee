// An all-to-all-v among threads standing for the ranks of a group (the expert-parallel tests':
// tests/unit/test_expert_parallel.cpp, test_tensor_parallel.cpp's EP x TP).
#pragma once

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/core/error.h"

namespace titan::test {

// An all-to-all-v among `degree` threads: each posts its send buffer and counts, and after a
// barrier copies its share from every peer's; a second barrier keeps the buffers until all have
// read. A rank that fails leaves both barriers, and the others then fail too.
class ThreadAllToAll {
 public:
  explicit ThreadAllToAll(int degree) : posts_(static_cast<size_t>(degree)), meet_(degree) {}

  void exchange(int rank, const void* send, const std::vector<int64_t>& send_counts, void* recv,
                const std::vector<int64_t>& recv_counts, DType dtype) {
    const size_t size = dtype_size(dtype);
    const auto degree = static_cast<int>(posts_.size());
    posts_[rank] = {static_cast<const std::byte*>(send), send_counts, dtype};
    meet_.arrive_and_wait();
    int64_t at = 0;
    for (int p = 0; p < degree; ++p) {
      const Post& post = posts_[p];
      TITAN_CHECK(post.counts.size() == static_cast<size_t>(degree), "rank ", p,
                  " left the exchange");
      TITAN_CHECK(post.dtype == dtype && post.counts[rank] == recv_counts[p], "rank ", rank,
                  " expects ", recv_counts[p], " elements from rank ", p, ", which sends ",
                  post.counts[rank]);
      int64_t from = 0;
      for (int q = 0; q < rank; ++q) from += post.counts[q];
      std::memcpy(static_cast<std::byte*>(recv) + at * size, post.send + from * size,
                  static_cast<size_t>(recv_counts[p]) * size);
      at += recv_counts[p];
    }
    meet_.arrive_and_wait();
  }
  void leave(int rank) {
    posts_[rank] = {};
    meet_.arrive_and_drop();
  }

 private:
  struct Post {
    const std::byte* send = nullptr;
    std::vector<int64_t> counts;
    DType dtype = DType::f32;
  };
  std::vector<Post> posts_;
  std::barrier<> meet_;
};

}  // namespace titan::test
