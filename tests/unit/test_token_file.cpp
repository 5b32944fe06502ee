// TokenFileWriter writes through io/atomic_file: nothing under the final name until commit, an
// abandoned writer leaves the previous file and no temporary, and a committed file reads back.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "error_of.h"
#include "scratch_dir.h"
#include "titan/data/token_file.h"
#include "titan/io/atomic_file.h"

namespace titan {
namespace {

using test::ScratchDir;

size_t files_in(const std::filesystem::path& dir) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir),
                                           std::filesystem::directory_iterator()));
}

std::vector<std::vector<int32_t>> docs_of(const std::string& path) {
  const auto reader = TokenFileReader::open(path);
  std::vector<std::vector<int32_t>> docs(reader->n_docs());
  for (size_t i = 0; i < docs.size(); ++i) reader->read_doc(i, docs[i]);
  return docs;
}

TEST(TokenFileWriter, NothingAppearsUntilCommitAndNothingStaysOnAbandon) {
  ScratchDir dir;
  const std::string path = dir / "t.bin";
  {
    TokenFileWriter w(path, 100);
    w.add_doc({1, 2, 3});
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_EQ(files_in(dir.path()), 1u);  // the temporary, in the same folder
  }
  EXPECT_EQ(files_in(dir.path()), 0u);
  {
    TokenFileWriter w(path, 100);
    w.add_doc({1, 2, 3});
    w.add_doc({});
    w.add_doc({99});
    w.commit();
  }
  const std::vector<std::vector<int32_t>> old = {{1, 2, 3}, {}, {99}};
  EXPECT_EQ(docs_of(path), old);
  {
    // A failed writer (a bad id) leaves the committed file as it was.
    TokenFileWriter w(path, 100);
    w.add_doc({4});
    EXPECT_NE(test::error_of([&] { w.add_doc({100}); }).find("outside the vocabulary"),
              std::string::npos);
  }
  EXPECT_EQ(docs_of(path), old);
  EXPECT_EQ(files_in(dir.path()), 1u);
}

TEST(AtomicFile, WriteAtOverwritesOnlyWhatIsWritten) {
  ScratchDir dir;
  AtomicFile f(dir / "out.bin");
  f.write("abcdef", 6);
  f.write_at(1, "XY", 2);
  EXPECT_NE(test::error_of([&] { f.write_at(5, "XY", 2); }).find("past the 6 written"),
            std::string::npos);
  f.commit();
  EXPECT_EQ(test::error_of([&] { f.write_at(0, "X", 1); }),
            dir / "out.bin" + ": write after commit");
  std::ifstream in(dir / "out.bin", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "aXYdef");
}

}  // namespace
}  // namespace titan
