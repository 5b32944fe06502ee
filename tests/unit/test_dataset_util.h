// Shared by the dataset, loader and tokenizer-training tests: scratch folders (scratch_dir.h),
// writing plain and gzip files, and a small tokenizer trained once per test binary on the default
// corpus.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "error_of.h"
#include "scratch_dir.h"
#include "titan/core/error.h"
#include "titan/data/tokenizer.h"
#include "titan/data/tokenizer_train.h"

namespace titan::test {

inline void write_text(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

inline void write_gzip(const std::string& path, const std::string& content) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, content.data(), static_cast<unsigned>(content.size())),
            static_cast<int>(content.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The debug tokenizer (2048 ids, <|endoftext|> as EOS and pad, ChatML specials), trained on the
// default corpus into a folder that lives as long as the test binary.
inline const std::string& trained_tokenizer_dir() {
  static const ScratchDir dir("tokenizer");
  static const std::string path = ensure_default_tokenizer(dir / "debug");
  return path;
}

inline const Tokenizer& trained_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(trained_tokenizer_dir());
  return tok;
}

}  // namespace titan::test
