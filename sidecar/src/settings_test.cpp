#include "idem/sidecar/settings.hpp"

#include <gtest/gtest.h>

namespace idem::sidecar {
namespace {

using namespace std::chrono_literals;

struct Example {
  std::string url;
  Millis timeout = 30s;
  std::size_t limit = 1024;
  std::int64_t workers = 8;
  bool flag = false;
  std::string mode = "a";
  std::optional<ListenAddress> admin = ListenAddress{"127.0.0.1", 9101};
  Settings settings;
  Example() {
    settings.text("url", url, /*secret=*/true);
    settings.duration("timeout", timeout);
    settings.size("limit", limit, 16);
    settings.integer("workers", 1, 256, [this](std::int64_t v) { workers = v; });
    settings.boolean("flag", flag);
    settings.choice("mode", {"a", "b"}, [this](const std::string& v) { mode = v; });
    settings.listen("admin_listen", admin);
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Settings, ReadsEveryKindFromTomlThenFlagsWin) {
  Example e;
  e.settings.read_text(
      "url = \"amqp://u:p@h/\"\ntimeout = \"1500ms\"\nlimit = \"2KiB\"\nworkers = 3\nflag = true\nmode = \"b\"\n"
      "admin_listen = \"off\"\n",
      "x.toml");
  EXPECT_EQ(e.url, "amqp://u:p@h/");
  EXPECT_EQ(e.timeout, 1500ms);
  EXPECT_EQ(e.limit, 2048u);
  EXPECT_EQ(e.workers, 3);
  EXPECT_TRUE(e.flag);
  EXPECT_EQ(e.mode, "b");
  EXPECT_FALSE(e.admin);
  e.settings.set_from_flag("workers", "--workers", "5");
  e.settings.set_from_flag("admin_listen", "--admin-listen", "127.0.0.1:0");
  EXPECT_EQ(e.workers, 5);
  ASSERT_TRUE(e.admin);
  EXPECT_EQ(e.admin->port, 0);
  EXPECT_TRUE(e.settings.given("workers"));
  Example fresh;
  EXPECT_FALSE(fresh.settings.given("workers"));
}

TEST(Settings, ErrorsNameTheSourceTheKeyAndTheLine) {
  Example e;
  EXPECT_EQ(error_of([&] { e.settings.read_text("\nworkers = 0\n", "x.toml"); }),
            "x.toml: workers: 0 is outside 1..256 (line 2)");
  EXPECT_EQ(error_of([&] { e.settings.read_text("wrokers = 1\n", "x.toml"); }), "x.toml: wrokers: unknown key (line 1)");
  EXPECT_EQ(error_of([&] { e.settings.read_text("timeout = 30\n", "x.toml"); }),
            "x.toml: timeout: a duration needs a unit, e.g. \"30s\" (units ms, s, m, h, d) (line 1)");
  EXPECT_NE(error_of([&] { e.settings.read_text("mode = \"c\"\n", "x.toml"); }).find("expected one of \"a\", \"b\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { e.settings.read_text("limit = 3\n", "x.toml"); }).find("must be at least 16 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { e.settings.read_text("flag = \"yes\"\n", "x.toml"); }).find("expected true or false"),
            std::string::npos);
  EXPECT_NE(error_of([&] { e.settings.read_text("[table]\n", "x.toml"); }).find("unknown key"), std::string::npos);
  EXPECT_NE(error_of([&] { e.settings.read_text("= broken", "x.toml"); }).find("x.toml: "), std::string::npos);
  EXPECT_EQ(error_of([&] { e.settings.set_from_flag("workers", "--workers", "many"); }),
            "--workers: \"many\": not an integer");
}

TEST(Settings, PathsAreAStringAnArrayOrACommaSeparatedFlag) {
  std::vector<std::string> files;
  Settings settings;
  settings.paths("secret_file", files);
  settings.read_text("secret_file = \"/etc/idem/a,b.secret\"\n", "x.toml");
  EXPECT_EQ(files, (std::vector<std::string>{"/etc/idem/a,b.secret"}));  // a string is one path, commas and all
  settings.read_text("secret_file = [\"/etc/idem/old\", \"/etc/idem/new\"]\n", "x.toml");
  EXPECT_EQ(files, (std::vector<std::string>{"/etc/idem/old", "/etc/idem/new"}));
  settings.set_from_flag("secret_file", "--secret-file", "/run/a,/run/b");
  EXPECT_EQ(files, (std::vector<std::string>{"/run/a", "/run/b"}));
  EXPECT_NE(error_of([&] { settings.read_text("secret_file = []\n", "x.toml"); }).find("at least one path"),
            std::string::npos);
  EXPECT_NE(error_of([&] { settings.read_text("secret_file = [\"/a\", 3]\n", "x.toml"); }).find("array of strings"),
            std::string::npos);
  EXPECT_NE(error_of([&] { settings.read_text("secret_file = 3\n", "x.toml"); }).find("a path or an array of paths"),
            std::string::npos);
  EXPECT_NE(error_of([&] { settings.set_from_flag("secret_file", "--secret-file", "/a,"); }).find("must not be empty"),
            std::string::npos);
}

TEST(Settings, ASecretValueIsNeverEchoed) {
  Example e;
  const auto message = error_of([&] { e.settings.read_text("url = 3\n", "x.toml"); });
  EXPECT_NE(message.find("url: expected a string, got an integer"), std::string::npos) << message;
  const auto empty = error_of([&] { e.settings.set_from_flag("url", "--url", ""); });
  EXPECT_EQ(empty, "--url: must not be empty");
}

}  // namespace
}  // namespace idem::sidecar
