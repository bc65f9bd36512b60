#include "idem/webhook/secret_file.hpp"
#include "idem/webhook/signing.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace idem::webhook {
namespace {

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/idem-webhook-secret-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(SecretFileTest, OneSecretPerLineAcrossFiles) {
  const auto a = write("a", "  whsec_one \r\n\n whsec_two\n", 0600);
  const auto b = write("b", "whsec_three", 0640);
  auto secrets = read_secret_files({a, b});
  ASSERT_TRUE(secrets.has_value()) << secrets.error();
  EXPECT_EQ(*secrets, (std::vector<std::string>{"whsec_one", "whsec_two", "whsec_three"}));
  wipe(*secrets);
  EXPECT_TRUE(secrets->empty());
}

TEST_F(SecretFileTest, OpenEmptyOrAbsentFilesAreRefusedWithoutTheirContents) {
  auto open = read_secret_file(write("open", "whsec_visible\n", 0644));
  ASSERT_FALSE(open.has_value());
  EXPECT_NE(open.error().find("mode 0644"), std::string::npos);
  EXPECT_EQ(open.error().find("whsec_visible"), std::string::npos);
  EXPECT_FALSE(read_secret_file(write("group_writable", "whsec_x\n", 0620)).has_value());
  auto empty = read_secret_file(write("empty", "\n \n", 0600));
  ASSERT_FALSE(empty.has_value());
  EXPECT_NE(empty.error().find("holds no secret"), std::string::npos);
  EXPECT_FALSE(read_secret_file(dir_ + "/absent").has_value());
  EXPECT_FALSE(read_secret_file(dir_).has_value());  // a directory
  // One bad file among good ones stops the whole read.
  EXPECT_FALSE(read_secret_files({write("good", "whsec_x\n", 0600), dir_ + "/absent"}).has_value());
}

TEST_F(SecretFileTest, ASignerLoadsEverySecretOfItsFiles) {
  const auto old_file = write("old", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n", 0600);
  const auto new_file = write("new", "whsec_MDEyMzQ1Njc4OWFiY2RlZg==\n", 0600);
  auto signer = StandardSigner::load({old_file, new_file});
  ASSERT_TRUE(signer.has_value()) << signer.error();
  const std::string signature = signer->signature("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})");
  // The specification's signature first, then the second secret's.
  EXPECT_TRUE(signature.starts_with("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,")) << signature;
  auto bad = StandardSigner::load({write("bad", "whsec_not*base64\n", 0600)});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().find("not*base64"), std::string::npos);
  EXPECT_FALSE(StandardSigner::load({write("open", "whsec_MDEy\n", 0644)}).has_value());
  EXPECT_FALSE(StandardSigner::load({}).has_value());
}

}  // namespace
}  // namespace idem::webhook
