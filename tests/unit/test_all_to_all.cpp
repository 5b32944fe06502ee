// Communicator::all_to_all_v_async and all_to_all_counts (distributed/communicator.h), the
// exchange expert parallel will move rows with, and gather_async, the export's: on the world this
// process joins (tests/CMakeLists.txt runs it as one rank and under mpirun on 3 ranks), with
// uneven counts, empty sends (a rank sends nothing to one peer, and one rank nothing at all), in
// f32, bf16 and i32, each queued on the communication stream while another collective is in
// flight; and what the communicator counts of each (distributed/comm_counts.h: the calls, the
// all-to-all-v's elements for the other ranks, the counts exchange's 8 bytes per peer, a gather's
// whole side; nothing in a world of one).
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "titan/core/error.h"
#include "titan/distributed/world.h"

namespace titan {
namespace {

// How many rows rank `from` sends rank `to`: uneven, 0 from rank 1 to rank 0, 0 from the last of
// 3 or more ranks to anyone.
int64_t rows_from_to(int from, int to, int size) {
  if (size >= 3 && from == size - 1) return 0;
  if (from == 1 && to == 0) return 0;
  return 1 + (3 * from + 2 * to) % 4;
}

// The value of element i of the row block `from` sends `to`: every one distinct.
int32_t value_of(int from, int to, int64_t i) {
  return static_cast<int32_t>(1000 * from + 100 * to + i);
}

TEST(AllToAll, CountsReachEachPeer) {
  Communicator& comm = world();
  const int rank = comm.rank(), size = comm.size();
  std::vector<int64_t> send(size);
  for (int p = 0; p < size; ++p) send[p] = rows_from_to(rank, p, size);
  const CommCounts before = comm.counts();
  const std::vector<int64_t> recv = comm.all_to_all_counts(send);
  const CollectiveCount counted = comm.counts().since(before)[Collective::all_to_all_counts];
  EXPECT_EQ(counted.calls, size > 1 ? 1 : 0);
  EXPECT_EQ(counted.bytes, 8 * (size - 1));
  ASSERT_EQ(static_cast<int>(recv.size()), size);
  for (int p = 0; p < size; ++p) EXPECT_EQ(recv[p], rows_from_to(p, rank, size)) << "from " << p;
  EXPECT_THROW(comm.all_to_all_counts(std::vector<int64_t>(size + 1, 0)), Error);
}

// The exchange of rows of `width` elements, in the three dtypes it takes.
template <typename T>
void exchange_rows(DType dtype, int64_t width) {
  Communicator& comm = world();
  const int rank = comm.rank(), size = comm.size();
  std::vector<int64_t> send_counts(size), recv_counts(size);
  for (int p = 0; p < size; ++p) {
    send_counts[p] = rows_from_to(rank, p, size) * width;
    recv_counts[p] = rows_from_to(p, rank, size) * width;
  }
  std::vector<T> send, want;
  for (int p = 0; p < size; ++p) {
    for (int64_t i = 0; i < send_counts[p]; ++i)
      send.push_back(static_cast<T>(value_of(rank, p, i)));
    for (int64_t i = 0; i < recv_counts[p]; ++i)
      want.push_back(static_cast<T>(value_of(p, rank, i)));
  }
  // One more element past the end, which must stay as it was.
  std::vector<T> recv(want.size() + 1, static_cast<T>(-7));
  const CommCounts before = comm.counts();
  // A barrier of the same stream meanwhile: the exchange is queued, not run on this thread.
  CommHandle handle = comm.all_to_all_v_async(send.empty() ? nullptr : send.data(), send_counts,
                                              recv.data(), recv_counts, dtype);
  comm.barrier();
  handle.wait();
  EXPECT_EQ(std::vector<T>(recv.begin(), recv.end() - 1), want);
  EXPECT_EQ(recv.back(), static_cast<T>(-7));
  const CommCounts counted = comm.counts().since(before);
  int64_t leaving = 0;
  for (int p = 0; p < size; ++p) leaving += p == rank ? 0 : send_counts[p];
  EXPECT_EQ(counted[Collective::all_to_all_v].calls, size > 1 ? 1 : 0);
  EXPECT_EQ(counted[Collective::all_to_all_v].bytes,
            leaving * static_cast<int64_t>(dtype_size(dtype)));
  EXPECT_EQ(counted[Collective::barrier].calls, size > 1 ? 1 : 0);
}

TEST(AllToAll, UnevenRowsAndEmptySendsInEveryDtype) {
  exchange_rows<float>(DType::f32, 3);
  exchange_rows<uint16_t>(DType::bf16, 5);  // raw bits: the values are exact as integers
  exchange_rows<int32_t>(DType::i32, 1);
}

TEST(AllToAll, BadCountsAreErrors) {
  Communicator& comm = world();
  const int size = comm.size();
  float x = 0.0f;
  EXPECT_THROW(comm.all_to_all_v_async(&x, std::vector<int64_t>(size + 1, 0), &x,
                                       std::vector<int64_t>(size, 0), DType::f32),
               Error);
  EXPECT_THROW(comm.all_to_all_v_async(&x, std::vector<int64_t>(size, 0), &x,
                                       std::vector<int64_t>(size, 0), DType::f16),
               Error);
}

TEST(AllToAll, SingleRankGroupCopies) {
  auto one = make_single_rank_communicator();
  const std::vector<float> send = {1.0f, 2.0f, 3.0f};
  std::vector<float> recv(3, 0.0f);
  one->all_to_all_v_async(send.data(), {3}, recv.data(), {3}, DType::f32).wait();
  EXPECT_EQ(recv, send);
  EXPECT_EQ(one->all_to_all_counts({4}), std::vector<int64_t>{4});
  EXPECT_THROW(one->all_to_all_v_async(send.data(), {3}, recv.data(), {2}, DType::f32), Error);
  EXPECT_NO_THROW(one->all_to_all_v_async(nullptr, {0}, nullptr, {0}, DType::bf16).wait());
}

// Communicator::gather_async, the export's gather of a unit onto the writing rank: to the last
// rank and to rank 0, parts in f32 and bf16 with uneven counts (one rank holding none); only the
// root's whole is written, the others' left as they were.
TEST(Gather, RootReceivesEveryRanksPartOthersNothing) {
  Communicator& comm = world();
  const int rank = comm.rank(), size = comm.size();
  std::vector<int64_t> counts(size);
  for (int p = 0; p < size; ++p) counts[p] = p == 1 ? 0 : 2 + p;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  for (const int root : {size - 1, 0}) {
    std::vector<float> own(static_cast<size_t>(counts[rank]));
    std::vector<uint16_t> own_bits(own.size());
    for (size_t i = 0; i < own.size(); ++i) {
      own[i] = static_cast<float>(value_of(rank, root, static_cast<int64_t>(i)));
      own_bits[i] = static_cast<uint16_t>(value_of(rank, root, static_cast<int64_t>(i)));
    }
    std::vector<float> whole(static_cast<size_t>(total) + 1, -7.0f);
    std::vector<uint16_t> whole_bits(static_cast<size_t>(total), 7);
    const CommCounts before = comm.counts();
    CommHandle handle =
        comm.gather_async({{whole.data(), own.data(), counts, DType::f32},
                           {whole_bits.data(), own_bits.data(), counts, DType::bf16}},
                          root);
    comm.barrier();  // queued, not run on this thread
    handle.wait();
    std::vector<float> want;
    std::vector<uint16_t> want_bits;
    for (int p = 0; p < size; ++p) {
      for (int64_t i = 0; i < counts[p]; ++i) {
        want.push_back(rank == root ? static_cast<float>(value_of(p, root, i)) : -7.0f);
        want_bits.push_back(rank == root ? static_cast<uint16_t>(value_of(p, root, i)) : 7);
      }
    }
    EXPECT_EQ(std::vector<float>(whole.begin(), whole.end() - 1), want) << "root " << root;
    EXPECT_EQ(whole.back(), -7.0f);
    EXPECT_EQ(whole_bits, want_bits) << "root " << root;
    const CollectiveCount counted = comm.counts().since(before)[Collective::gather];
    EXPECT_EQ(counted.calls, size > 1 ? 1 : 0);
    EXPECT_EQ(counted.bytes, size > 1 ? total * (4 + 2) : 0);
  }
  float x = 0.0f;
  EXPECT_THROW(comm.gather_async({{&x, &x, counts, DType::f32}}, size), Error);
  EXPECT_THROW(comm.gather_async({{&x, &x, std::vector<int64_t>(size + 1, 0), DType::f32}}, 0),
               Error);
}

}  // namespace
}  // namespace titan
