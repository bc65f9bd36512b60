#include "key_commands.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "idem/encrypted_store.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/test_keys.hpp"
#include "store_commands.hpp"

namespace idem::cli {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr TimePoint kNow = from_epoch_ms(1'767'225'600'000);  // 2026-01-01T00:00:00.000Z
constexpr std::string_view kSecret = "card 4242 4242 4242 4242";

struct Capture {
  std::ostringstream out, err;
  Output text() { return Output{out, err, false}; }
  Output json() { return Output{out, err, true}; }
  nlohmann::json parsed() const { return nlohmann::json::parse(out.str()); }
};

// Records as an encrypting gateway leaves them, read back raw as idemctl does.
class EncryptedRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto inner = std::make_unique<MemoryStore>();
    raw = inner.get();
    store = std::make_unique<EncryptedStore>(std::move(inner), raw, old_keys);
    complete("acme", "key-old-000000000001", std::string(kSecret));
    store->set_keys(both_keys);
    complete("acme", "key-new-000000000001", std::string(kSecret));
    complete("acme", "key-new-000000000002", std::string(kSecret), /*expired=*/true);
    // One from before encryption was turned on.
    complete_on(*raw, "acme", "key-plain-0000000001", "plain");
  }

  void complete(const std::string& tenant, const std::string& key, std::string body, bool expired = false) {
    complete_on(*store, tenant, key, std::move(body), expired);
  }
  static void complete_on(Store& s, const std::string& tenant, const std::string& key, std::string body,
                         bool expired = false) {
    ClaimRequest c;
    c.id = RecordId{tenant, key};
    c.request_hash = std::string(64, 'a');
    c.token = 7;
    c.now = expired ? kNow - 48h : kNow;
    c.lease_expires = c.now + 1min;
    c.expires = c.now + 24h;
    ASSERT_EQ(BlockingStore(s).claim(c)->status, ClaimStatus::claimed);
    ASSERT_EQ(BlockingStore(s).complete(CompleteRequest{Fence{c.id, 7}, StoredResponse{201, {{"X-A", "1"}}, body},
                                                        c.now, c.expires}),
              FenceStatus::ok);
  }

  std::shared_ptr<const KeyRing> old_keys = testing::test_key_ring(testing::test_key_line("2025-06", 1));
  std::shared_ptr<const KeyRing> both_keys =
      testing::test_key_ring(testing::test_key_line("2025-06", 1) + testing::test_key_line("2026-01", 2));
  MemoryStore* raw = nullptr;
  std::unique_ptr<EncryptedStore> store;
};

TEST_F(EncryptedRecordsTest, GetWithoutTheKeyFileShowsMetadataOnly) {
  Capture c;
  ASSERT_EQ(run_get(*raw, {"acme", "key-old-000000000001"}, false, kNow, c.text()), kExitOk) << c.err.str();
  EXPECT_THAT(c.out.str(), HasSubstr("state          completed\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("response       encrypted with key id \"2025-06\" (--key-file shows it)\n"));
  EXPECT_THAT(c.out.str(), Not(HasSubstr("status")));
  Capture body;
  EXPECT_EQ(run_get(*raw, {"acme", "key-old-000000000001"}, true, kNow, body.text()), kExitFailure);
  EXPECT_THAT(body.err.str(), HasSubstr("encrypted with key id \"2025-06\": give --key-file"));
  EXPECT_EQ(body.out.str(), "");
  Capture j;
  ASSERT_EQ(run_get(*raw, {"acme", "key-old-000000000001"}, false, kNow, j.json()), kExitOk);
  EXPECT_EQ(j.parsed()["response"], nlohmann::json({{"encrypted", true}, {"key_id", "2025-06"}, {"error", nullptr}}));
}

TEST_F(EncryptedRecordsTest, GetWithTheKeyFileShowsTheResponse) {
  Capture c;
  ASSERT_EQ(run_get(*raw, {"acme", "key-new-000000000001"}, false, kNow, c.text(), both_keys.get()), kExitOk);
  EXPECT_THAT(c.out.str(), HasSubstr("encrypted      key id \"2026-01\"\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("status         201\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("header         X-A: 1\n"));
  Capture body;
  ASSERT_EQ(run_get(*raw, {"acme", "key-new-000000000001"}, true, kNow, body.text(), both_keys.get()), kExitOk);
  EXPECT_EQ(body.out.str(), kSecret);
  Capture plain;
  ASSERT_EQ(run_get(*raw, {"acme", "key-plain-0000000001"}, true, kNow, plain.text(), both_keys.get()), kExitOk);
  EXPECT_EQ(plain.out.str(), "plain");
}

TEST_F(EncryptedRecordsTest, GetWithAKeyFileLackingTheKeyIsExitOne) {
  Capture c;
  EXPECT_EQ(run_get(*raw, {"acme", "key-new-000000000001"}, false, kNow, c.text(), old_keys.get()), kExitFailure);
  EXPECT_THAT(c.out.str(), HasSubstr("encrypted with key id \"2026-01\"; cannot be decrypted"));
  EXPECT_THAT(c.err.str(), HasSubstr("which the key file does not list"));
}

TEST_F(EncryptedRecordsTest, ListShowsEncOrTheStatus) {
  Capture without;
  ASSERT_EQ(run_list(*raw, {}, kNow, without.text()), kExitOk);
  EXPECT_THAT(without.out.str(), HasSubstr("completed        enc    "));
  EXPECT_THAT(without.out.str(), HasSubstr("completed        201    "));  // the plaintext record
  EXPECT_THAT(without.err.str(), HasSubstr("3 responses are encrypted (STATUS enc); --key-file shows"));
  Capture with;
  ASSERT_EQ(run_list(*raw, {}, kNow, with.text(), both_keys.get()), kExitOk);
  EXPECT_THAT(with.out.str(), Not(HasSubstr(" enc ")));
  EXPECT_EQ(with.err.str(), "");
  Capture lacking;
  EXPECT_EQ(run_list(*raw, {}, kNow, lacking.json(), old_keys.get()), kExitFailure);
  EXPECT_THAT(lacking.err.str(), HasSubstr("cannot decrypt"));
  const auto records = lacking.parsed()["records"];
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0]["response"]["key_id"], "2026-01");  // key-new-... sorts first
  EXPECT_TRUE(records[0]["response"]["error"].is_string());
  EXPECT_EQ(records[2]["response"]["status"], 201);  // key-old-..., opened
  EXPECT_EQ(records[2]["response"]["encrypted"], true);
}

TEST_F(EncryptedRecordsTest, UsageCountsRecordsPerKeyId) {
  Capture c;
  ASSERT_EQ(run_keys_usage(*raw, both_keys.get(), kNow, c.json()), kExitOk) << c.err.str();
  const auto j = c.parsed();
  EXPECT_EQ(j["records_scanned"], 4);
  EXPECT_EQ(j["plaintext"], nlohmann::json({{"live", 1}, {"expired", 0}}));
  ASSERT_EQ(j["keys"].size(), 2u);
  EXPECT_EQ(j["keys"][0], nlohmann::json({{"key_id", "2025-06"}, {"live", 1}, {"expired", 0}, {"in_key_file", true},
                                          {"role", "decrypts"}}));
  EXPECT_EQ(j["keys"][1], nlohmann::json({{"key_id", "2026-01"}, {"live", 1}, {"expired", 1}, {"in_key_file", true},
                                          {"role", "encrypts"}}));
  EXPECT_TRUE(j["removable"].empty());
  EXPECT_TRUE(j["missing"].empty());
}

TEST_F(EncryptedRecordsTest, UsageSaysWhichKeyMayGoAndWhichIsMissing) {
  // A file that dropped 2025-06 too early, lists an older key no record uses, and the next key.
  auto file = testing::test_key_ring(testing::test_key_line("2024-01", 3) + testing::test_key_line("2026-01", 2) +
                                     testing::test_key_line("2026-07", 4, "decrypt-only"));
  Capture c;
  ASSERT_EQ(run_keys_usage(*raw, file.get(), kNow, c.text()), kExitOk);
  EXPECT_THAT(c.out.str(), HasSubstr("(plaintext)             1         0         -\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("2025-06                 1         0         MISSING\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("2024-01                 0         0         decrypts\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("2026-07                 0         0         decrypt-only\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("4 records scanned\n"));
  EXPECT_THAT(c.err.str(), HasSubstr("key \"2024-01\" holds no live record: it may be removed"));
  EXPECT_THAT(c.err.str(), Not(HasSubstr("key \"2026-07\"")));  // the next key, not an old one
  EXPECT_THAT(c.err.str(), HasSubstr("1 live record(s) use key id \"2025-06\", which the key file does not list"));
}

TEST_F(EncryptedRecordsTest, KeysListNeverShowsKeyMaterial) {
  Capture c;
  ASSERT_EQ(run_keys_list(*both_keys, "/etc/idem/keys", c.text()), kExitOk);
  EXPECT_THAT(c.out.str(), HasSubstr("2025-06                 decrypts      " + both_keys->keys()[0].check + "\n"));
  EXPECT_THAT(c.out.str(), HasSubstr("2026-01                 encrypts      "));
  for (unsigned char n : {1, 2}) {
    EXPECT_THAT(c.out.str(), Not(HasSubstr(testing::test_base64(testing::test_key_bytes(n)).substr(0, 12))));
  }
  Capture j;
  ASSERT_EQ(run_keys_list(*both_keys, "/etc/idem/keys", j.json()), kExitOk);
  EXPECT_EQ(j.parsed()["encrypts_with"], "2026-01");
}

}  // namespace
}  // namespace idem::cli
