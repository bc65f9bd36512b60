// The Redis record codec's decoder: a value read back from Redis (another version, a damaged
// key, an operator's SET) is a Record or a corrupt error, and what it decodes re-encodes to a
// value that decodes to the same record. Keys too: parse_record_key inverts record_key.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>

#include "check.hpp"
#include "record_codec.hpp"

namespace rd = idem::redis_detail;

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string prefix = in.ConsumeRandomLengthString(8);
  const std::string redis_key = in.ConsumeRandomLengthString(80);
  const std::string value = in.ConsumeRemainingBytesAsString();

  if (auto id = rd::parse_record_key(prefix, redis_key)) {
    FUZZ_CHECK(rd::record_key(prefix, *id) == redis_key, "parse_record_key inverts record_key");
  }

  const idem::RecordId id{"tenant", "key-0123456789abcdef"};
  auto record = rd::decode_record(id, value);
  const auto head = rd::parse_record_head(value.substr(0, rd::kHeadBytes));
  if (!record) {
    FUZZ_CHECK(record.error().code == idem::StoreErrc::corrupt, "an unreadable value is corrupt");
    return 0;
  }
  FUZZ_CHECK(record->tenant == id.tenant && record->key == id.key, "the record is the id's");
  FUZZ_CHECK(record->state != idem::RecordState::completed || record->response.has_value(),
             "a completed record has its response");
  if (head) {
    FUZZ_CHECK(head->state == record->state, "the head and the whole value agree on the state");
  }
  const std::string encoded = rd::encode_record(*record);
  auto again = rd::decode_record(id, encoded);
  FUZZ_CHECK(again.has_value(), "an encoded record decodes");
  FUZZ_CHECK(rd::encode_record(*again) == encoded, "encode(decode(encode(r))) == encode(r)");
  FUZZ_CHECK(again->state == record->state && again->fencing_token == record->fencing_token &&
                 again->request_hash == record->request_hash && again->response == record->response &&
                 again->expires == record->expires && again->lease_expires == record->lease_expires,
             "the round trip keeps the record");
  return 0;
}
