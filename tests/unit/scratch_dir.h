// A fresh folder under the system temp dir, removed with everything in it when the object goes
// away: the tests' one scratch folder.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace titan::test {

class ScratchDir {
 public:
  // Named after the running test.
  ScratchDir() : ScratchDir(running_test_name()) {}
  // Named `name`: a folder a test binary's tests share (a static), or one of several in a test.
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("titan_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static std::string running_test_name() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string(info->test_suite_name()) + "_" + info->name();
  }

  std::filesystem::path path_;
};

}  // namespace titan::test
