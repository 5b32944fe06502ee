// The main of the tests that run on the world's ranks (test_all_to_all, test_vocab_parallel): on
// one process, or under mpirun where every rank runs every test, so the collectives meet in the
// same order on all of them.
#include <gtest/gtest.h>

#include "titan/distributed/world.h"

int main(int argc, char** argv) {
  titan::init_world(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  titan::finalize_world();
  return failed;
}
