// The torchelastic error file read back as torchrun reads it (ProcessFailure._get_error_data): message, py_callstack
// and a timestamp that int() accepts; a file already there replaced (as torchelastic's record_exception does);
// record_elastic_error writing only under TORCHELASTIC_ERROR_FILE and only warning when it cannot.
#include "utils/elastic_error_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace bridge::utils {
namespace {

namespace fs = std::filesystem;

class ElasticErrorFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("bridge_elastic_error_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
  }
  void TearDown() override {
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
    fs::remove_all(dir_);
  }
  static nlohmann::json read(const fs::path& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  }
  fs::path dir_;
};

TEST_F(ElasticErrorFile, WritesTorchelasticsFormat) {
  const fs::path path = dir_ / "error.json";
  write_elastic_error_file(path, "bridge-pretrain: rank 1: training failed: \"quoted\"\nsecond line",
                           "bridge::utils::DamagedFileError on rank 1 of 2", 1732812345);
  const nlohmann::json data = read(path);
  const nlohmann::json& message = data.at("message");
  EXPECT_EQ(message.at("message"), "bridge-pretrain: rank 1: training failed: \"quoted\"\nsecond line");
  EXPECT_EQ(message.at("extraInfo").at("py_callstack"), "bridge::utils::DamagedFileError on rank 1 of 2");
  // A string of whole seconds, as torchelastic writes str(int(time.time())).
  EXPECT_EQ(message.at("extraInfo").at("timestamp"), "1732812345");
  EXPECT_FALSE(fs::exists(dir_ / "error.json.tmp"));
}

TEST_F(ElasticErrorFile, ReplacesAFileAlreadyThereAsTorchelasticDoes) {
  const fs::path path = dir_ / "error.json";
  std::ofstream(path) << "{\"message\": \"older\"}";
  write_elastic_error_file(path, "newer", "stack", 7);
  EXPECT_EQ(read(path).at("message").at("message"), "newer");
}

TEST_F(ElasticErrorFile, InvalidUtf8IsReplacedNotRefused) {
  const fs::path path = dir_ / "error.json";
  write_elastic_error_file(path, std::string("file \xff\xfe missing"), "", 1);
  EXPECT_NE(read(path).at("message").at("message").get<std::string>().find("missing"), std::string::npos);
}

TEST_F(ElasticErrorFile, AnUnwritablePathThrowsNamingIt) {
  const fs::path path = dir_ / "no_such_folder" / "error.json";
  try {
    write_elastic_error_file(path, "m", "s");
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("no_such_folder"), std::string::npos) << error.what();
  }
}

TEST_F(ElasticErrorFile, RecordWritesOnlyUnderTorchelasticErrorFile) {
  EXPECT_FALSE(elastic_error_file_path().has_value());
  EXPECT_FALSE(record_elastic_error("m", "s"));

  const fs::path path = dir_ / "error.json";
  ::setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  ASSERT_EQ(elastic_error_file_path(), path);
  EXPECT_TRUE(record_elastic_error("the message", "the stack"));
  const nlohmann::json data = read(path);
  EXPECT_EQ(data.at("message").at("message"), "the message");
  const long long timestamp = std::stoll(data.at("message").at("extraInfo").at("timestamp").get<std::string>());
  EXPECT_NEAR(static_cast<double>(timestamp), static_cast<double>(std::time(nullptr)), 5.0);

  // Unwritable: a warning, not an exception (the exit path goes on with the failure's own status).
  ::setenv("TORCHELASTIC_ERROR_FILE", (dir_ / "missing" / "error.json").c_str(), 1);
  EXPECT_FALSE(record_elastic_error("m", "s"));
}

}  // namespace
}  // namespace bridge::utils
