#include "idem/encryption.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "idem/testing/test_keys.hpp"

namespace idem {
namespace {

using testing::test_base64;
using testing::test_key_bytes;
using testing::test_key_line;

std::string b64(std::string_view bytes) { return test_base64(bytes); }
std::string key_bytes(unsigned char n) { return test_key_bytes(n); }
std::string key_line(std::string_view id, unsigned char n, std::string_view flag = "") {
  return test_key_line(id, n, flag);
}

std::shared_ptr<const KeyRing> ring(const std::string& text) {
  auto r = KeyRing::parse(text, "keys");
  EXPECT_TRUE(r) << r.error();
  return r ? *r : nullptr;
}

std::string parse_error(const std::string& text) {
  auto r = KeyRing::parse(text, "keys");
  EXPECT_FALSE(r) << text;
  return r ? std::string() : r.error();
}

const RecordId kId{"acme", "key-0000000000000001"};

StoredResponse sample() {
  StoredResponse r;
  r.status = 201;
  r.headers = {{"Content-Type", "application/json"}, {"Set-Cookie", "a=1"}, {"Set-Cookie", "b=2"}};
  r.body = R"({"id":"pay_1","card":"4242 4242 4242 4242"})";
  return r;
}

TEST(KeyRing, SealedResponsesRoundTripAndHideEverything) {
  auto keys = ring(key_line("k1", 1) + key_line("k2", 2));
  ASSERT_TRUE(keys);
  ASSERT_NE(keys->sealing_key_id(), nullptr);
  EXPECT_EQ(*keys->sealing_key_id(), "k2");  // the last key seals

  std::string binary("\0\x01\xff\r\n body", 9);
  std::vector<StoredResponse> cases = {sample(), StoredResponse{200, {}, ""}, StoredResponse{204, {}, binary},
                                       StoredResponse{410, {{"X", ""}}, std::string(3 * 1024 * 1024, 'x')}};
  for (const StoredResponse& original : cases) {
    auto sealed = keys->seal(kId, original);
    ASSERT_TRUE(sealed) << sealed.error().message;
    EXPECT_TRUE(is_sealed(*sealed));
    EXPECT_EQ(sealed->status, kSealedStatus);
    ASSERT_EQ(sealed->headers.size(), 1u);
    EXPECT_EQ(sealed->headers[0].name, kSealedHeader);
    EXPECT_EQ(sealed->headers[0].value, "v1 k2");
    EXPECT_EQ(sealed_key_id(*sealed), "k2");
    // nonce + (status, headers length, headers, body) + tag
    EXPECT_GE(sealed->body.size(), 12 + 6 + original.body.size() + 16);
    if (!original.body.empty() && original.body.size() < 1000) {
      EXPECT_EQ(sealed->body.find(original.body), std::string::npos);
    }
    EXPECT_EQ(sealed->body.find("application/json"), std::string::npos);
    EXPECT_EQ(sealed->body.find("Set-Cookie"), std::string::npos);
    auto opened = keys->open(kId, *sealed);
    ASSERT_TRUE(opened) << opened.error().message;
    EXPECT_EQ(*opened, original);
  }
}

TEST(KeyRing, EveryWriteHasAFreshNonce) {
  auto keys = ring(key_line("k1", 1));
  std::set<std::string> nonces;
  std::set<std::string> bodies;
  for (int i = 0; i < 1000; ++i) {
    auto sealed = keys->seal(kId, sample());
    ASSERT_TRUE(sealed);
    nonces.insert(sealed->body.substr(0, 12));
    bodies.insert(sealed->body);
  }
  EXPECT_EQ(nonces.size(), 1000u);
  EXPECT_EQ(bodies.size(), 1000u);
}

TEST(KeyRing, AnyAlteredByteIsRefused) {
  auto keys = ring(key_line("k1", 1));
  auto sealed = keys->seal(kId, sample());
  ASSERT_TRUE(sealed);
  for (std::size_t i = 0; i < sealed->body.size(); ++i) {
    for (unsigned char bit : {0x01, 0x80}) {
      StoredResponse altered = *sealed;
      altered.body[i] = static_cast<char>(altered.body[i] ^ bit);
      auto opened = keys->open(kId, altered);
      ASSERT_FALSE(opened) << "byte " << i;
      EXPECT_EQ(opened.error().code, OpenErrc::rejected) << "byte " << i;
      EXPECT_EQ(opened.error().key_id, "k1");
    }
  }
  StoredResponse truncated = *sealed;
  truncated.body.pop_back();
  EXPECT_EQ(keys->open(kId, truncated).error().code, OpenErrc::rejected);
  truncated.body.resize(20);
  EXPECT_EQ(keys->open(kId, truncated).error().code, OpenErrc::malformed);
  StoredResponse longer = *sealed;
  longer.body.push_back('x');
  EXPECT_EQ(keys->open(kId, longer).error().code, OpenErrc::rejected);
}

TEST(KeyRing, AlteredMarkersAreRefused) {
  auto keys = ring(key_line("k1", 1) + key_line("k2", 2));
  auto sealed = keys->seal(kId, sample());
  ASSERT_TRUE(sealed);
  {
    // Relabelled with the other key's id: the key id is in the associated data too.
    StoredResponse relabelled = *sealed;
    relabelled.headers[0].value = "v1 k1";
    auto opened = keys->open(kId, relabelled);
    ASSERT_FALSE(opened);
    EXPECT_EQ(opened.error().code, OpenErrc::rejected);
  }
  for (auto alter : std::vector<std::function<void(StoredResponse&)>>{
           [](StoredResponse& r) { r.status = 200; },
           [](StoredResponse& r) { r.headers[0].value = "v2 k2"; },
           [](StoredResponse& r) { r.headers[0].value = "v1 "; },
           [](StoredResponse& r) { r.headers[0].value = "v1 k2 extra"; },
           [](StoredResponse& r) { r.headers.push_back({"Content-Type", "text/plain"}); },
       }) {
    StoredResponse altered = *sealed;
    alter(altered);
    auto opened = keys->open(kId, altered);
    ASSERT_FALSE(opened);
    EXPECT_EQ(opened.error().code, OpenErrc::malformed) << opened.error().message;
  }
}

TEST(KeyRing, ACiphertextOpensOnlyUnderItsOwnRecord) {
  auto keys = ring(key_line("k1", 1));
  const RecordId a{"ab", "c-key-00000000000001"};
  auto sealed = keys->seal(a, sample());
  ASSERT_TRUE(sealed);
  EXPECT_TRUE(keys->open(a, *sealed));
  for (const RecordId& other : {RecordId{"a", "bc-key-00000000000001"}, RecordId{"c-key-00000000000001", "ab"},
                                RecordId{"ab", "c-key-00000000000002"}, RecordId{"zz", "c-key-00000000000001"},
                                RecordId{"", "abc-key-00000000000001"}}) {
    auto opened = keys->open(other, *sealed);
    ASSERT_FALSE(opened) << other.tenant << "/" << other.key;
    EXPECT_EQ(opened.error().code, OpenErrc::rejected);
    EXPECT_NE(opened.error().message.find("copied from another record"), std::string::npos);
  }
}

TEST(KeyRing, AnUnknownKeyIdIsRefusedNamingIt) {
  auto old_keys = ring(key_line("2024-06", 1));
  auto sealed = old_keys->seal(kId, sample());
  ASSERT_TRUE(sealed);
  auto other = ring(key_line("2025-01", 2));
  auto opened = other->open(kId, *sealed);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().code, OpenErrc::unknown_key);
  EXPECT_EQ(opened.error().key_id, "2024-06");
  EXPECT_NE(opened.error().message.find("\"2024-06\""), std::string::npos) << opened.error().message;
  EXPECT_NE(opened.error().message.find("\"acme\""), std::string::npos) << opened.error().message;
  // The same id with other bytes (a key file edited by hand) is a failed tag, not a success.
  auto impostor = ring(key_line("2024-06", 3));
  EXPECT_EQ(impostor->open(kId, *sealed).error().code, OpenErrc::rejected);
}

TEST(KeyRing, PlaintextResponsesPassThrough) {
  auto keys = ring(key_line("k1", 1));
  const StoredResponse plain = sample();
  auto opened = keys->open(kId, plain);
  ASSERT_TRUE(opened);
  EXPECT_EQ(*opened, plain);
  // A status of 999 alone is not the marker: the ':' header is (no HTTP response can carry it).
  const StoredResponse odd{999, {{"Content-Type", "text/plain"}}, "hi"};
  EXPECT_FALSE(is_sealed(odd));
  EXPECT_EQ(*keys->open(kId, odd), odd);
  EXPECT_FALSE(sealed_key_id(plain));
}

TEST(KeyRing, RotationOpensOldRecordsAndSealsWithTheNewestKey) {
  auto before = ring(key_line("2024-06", 1));
  auto during = ring(key_line("2024-06", 1) + key_line("2025-01", 2, "decrypt-only"));
  auto after = ring(key_line("2024-06", 1) + key_line("2025-01", 2));
  EXPECT_EQ(*during->sealing_key_id(), "2024-06");
  EXPECT_EQ(*after->sealing_key_id(), "2025-01");
  auto old_record = before->seal(kId, sample());
  auto new_record = after->seal(kId, sample());
  ASSERT_TRUE(old_record && new_record);
  EXPECT_EQ(sealed_key_id(*new_record), "2025-01");
  for (const auto& r : {during, after}) {
    EXPECT_TRUE(r->open(kId, *old_record));
    EXPECT_TRUE(r->open(kId, *new_record));
  }
  EXPECT_EQ(before->open(kId, *new_record).error().code, OpenErrc::unknown_key);
  EXPECT_EQ(sealed_key_id(*during->seal(kId, sample())), "2024-06");
}

TEST(KeyRing, EveryKeyDecryptOnlyStoresPlaintextWithAWarning) {
  std::vector<std::string> warnings;
  auto r = KeyRing::parse(key_line("k1", 1, "decrypt-only"), "keys", &warnings);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ((*r)->sealing_key_id(), nullptr);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("unencrypted"), std::string::npos);
  auto kept = (*r)->seal(kId, sample());
  ASSERT_TRUE(kept);
  EXPECT_EQ(*kept, sample());
}

TEST(KeyRing, CommentsBlankLinesAndCrLfAreAccepted) {
  auto keys = ring("# idem keys\r\n\r\n  k1   " + b64(key_bytes(1)) + "  # the first\r\n\tk2\t" + b64(key_bytes(2)) +
                   " decrypt-only\r\n");
  ASSERT_TRUE(keys);
  ASSERT_EQ(keys->keys().size(), 2u);
  EXPECT_EQ(keys->keys()[0].id, "k1");
  EXPECT_FALSE(keys->keys()[0].decrypt_only);
  EXPECT_TRUE(keys->keys()[1].decrypt_only);
  EXPECT_EQ(*keys->sealing_key_id(), "k1");
  EXPECT_TRUE(keys->contains("k2"));
  EXPECT_FALSE(keys->contains("k3"));
}

TEST(KeyRing, CheckValuesCompareKeysWithoutShowingThem) {
  auto a = ring(key_line("k1", 1) + key_line("k2", 2));
  auto b = ring(key_line("other-name", 1));
  EXPECT_EQ(a->keys()[0].check.size(), 16u);
  EXPECT_EQ(a->keys()[0].check, b->keys()[0].check);
  EXPECT_NE(a->keys()[0].check, a->keys()[1].check);
  EXPECT_EQ(b64(key_bytes(1)).find(a->keys()[0].check), std::string::npos);
}

TEST(KeyRing, BadKeyFilesGetOneLineErrorsThatNeverQuoteKeyMaterial) {
  const std::string k1 = b64(key_bytes(1));
  const std::string short_key = b64(std::string(16, '\x07'));
  const std::string long_key = b64(std::string(48, '\x07'));
  struct Case {
    std::string text;
    std::string expected;
  } cases[] = {
      {"", "keys: no key"},
      {"# only a comment\n\n", "keys: no key"},
      {"k1 " + short_key + "\n", "keys: line 1: key \"k1\": the key is 16 bytes, expected 32"},
      {"k1 " + long_key + "\n", "keys: line 1: key \"k1\": the key is 48 bytes, expected 32"},
      {"k1 " + k1.substr(0, 43) + "\n", "not standard base64"},
      {"k1 " + k1.substr(0, 40) + "AR==\n", "not standard base64"},  // stray bits under the padding
      {"k1 " + std::string(44, '*') + "\n", "not standard base64"},
      {"\n\nk1\n", "keys: line 3: expected \"ID BASE64-KEY\""},
      {"k1 " + k1 + " decrypt-only extra\n", "(4 fields)"},
      {"k1 " + k1 + " primary\n", "the third field may only be \"decrypt-only\""},
      {k1 + " k1\n", "the key id must be 1-64 characters"},
      {"k/1 " + k1 + "\n", "the key id must be 1-64 characters"},
      {std::string(65, 'a') + " " + k1 + "\n", "the key id must be 1-64 characters"},
      {"k1 " + k1 + "\nk1 " + b64(key_bytes(2)) + "\n", "keys: line 2: key id \"k1\" is listed twice"},
      {"k1 " + k1 + "\nk2 " + k1 + "\n", "keys: line 2: key \"k2\" has the same bytes as key \"k1\""},
  };
  for (const auto& c : cases) {
    const std::string e = parse_error(c.text);
    EXPECT_NE(e.find(c.expected), std::string::npos) << "got: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    for (const std::string& secret : {k1, short_key, long_key, k1.substr(0, 20), key_bytes(1), std::string(44, '*')}) {
      EXPECT_EQ(e.find(secret), std::string::npos) << "key material in: " << e;
    }
  }
}

class KeyFile : public ::testing::Test {
 protected:
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("idem-keys-" + std::to_string(::getpid()));
  std::string path = (dir / "keys").string();
  void SetUp() override { std::filesystem::create_directories(dir); }
  void TearDown() override { std::filesystem::remove_all(dir); }
  void write(const std::string& text, mode_t mode) {
    std::ofstream(path, std::ios::trunc) << text;
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
  }
};

TEST_F(KeyFile, LoadsAPrivateFile) {
  for (mode_t mode : {0600, 0400, 0640, 0440}) {
    write(key_line("k1", 1), mode);
    auto r = KeyRing::load(path);
    ASSERT_TRUE(r) << r.error();
    EXPECT_EQ(*(*r)->sealing_key_id(), "k1");
  }
}

TEST_F(KeyFile, RefusesAFileOthersCanReadOrChange) {
  for (mode_t mode : {0644, 0604, 0666, 0660, 0602}) {
    write(key_line("k1", 1), mode);
    auto r = KeyRing::load(path);
    ASSERT_FALSE(r) << std::oct << mode;
    EXPECT_NE(r.error().find("chmod 600"), std::string::npos) << r.error();
  }
}

TEST_F(KeyFile, RefusesWhatIsNotARegularFile) {
  auto missing = KeyRing::load((dir / "absent").string());
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("cannot read the key file"), std::string::npos) << missing.error();
  auto directory = KeyRing::load(dir.string());
  ASSERT_FALSE(directory);
  EXPECT_NE(directory.error().find("not a regular file"), std::string::npos) << directory.error();
}

TEST_F(KeyFile, ErrorsNameTheFile) {
  write("k1 " + b64(std::string(31, 'x')) + "\n", 0600);
  auto r = KeyRing::load(path);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), path + ": line 1: key \"k1\": the key is 31 bytes, expected 32; make one with `openssl rand "
                              "-base64 32`");
}

TEST_F(KeyFile, AddKeyCreatesAPrivateFileAndAppendsToIt) {
  auto first = add_key_to_file(path, "", false);
  ASSERT_TRUE(first) << first.error();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto second = add_key_to_file(path, "", true);  // the same day: the date with a suffix
  ASSERT_TRUE(second) << second.error();
  EXPECT_EQ(second->id, first->id + ".2");
  EXPECT_TRUE(second->decrypt_only);
  auto named = add_key_to_file(path, "2031-rotation", false);
  ASSERT_TRUE(named) << named.error();
  auto ring = KeyRing::load(path);
  ASSERT_TRUE(ring) << ring.error();
  ASSERT_EQ((*ring)->keys().size(), 3u);
  EXPECT_EQ(*(*ring)->sealing_key_id(), "2031-rotation");
  EXPECT_NE((*ring)->keys()[0].check, (*ring)->keys()[2].check);  // fresh bytes every time
  auto again = add_key_to_file(path, "2031-rotation", false);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().find("already listed"), std::string::npos) << again.error();
  EXPECT_FALSE(add_key_to_file(path, "bad id", false));
}

TEST_F(KeyFile, AddKeyKeepsAHandWrittenFileIntact) {
  write(key_line("old", 1).substr(0, key_line("old", 1).size() - 1), 0600);  // no final newline
  auto added = add_key_to_file(path, "new", false);
  ASSERT_TRUE(added) << added.error();
  auto ring = KeyRing::load(path);
  ASSERT_TRUE(ring) << ring.error();
  EXPECT_EQ((*ring)->keys()[0].id, "old");
  EXPECT_EQ(*(*ring)->sealing_key_id(), "new");
  write(key_line("old", 1), 0644);
  auto refused = add_key_to_file(path, "new2", false);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().find("chmod 600"), std::string::npos);
  write("old tooshort\n", 0600);
  EXPECT_FALSE(add_key_to_file(path, "new3", false));  // an invalid file is not appended to
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "old tooshort\n");
}

}  // namespace
}  // namespace idem
