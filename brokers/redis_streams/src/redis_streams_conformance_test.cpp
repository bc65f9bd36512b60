// The broker conformance suite (testing/broker_conformance) on Redis Streams: the shared test
// server for the main suite, a private redis-server for the restart suite (it stops the server).
#include <gtest/gtest.h>

#include <stdexcept>

#include "entry_codec.hpp"
#include "idem/redis_stream_broker.hpp"
#include "idem/testing/broker_conformance.hpp"
#include "test_support.hpp"

namespace idem::redis_streams {
namespace {

using redis_detail::Reply;

class StreamUnderTest final : public testing::BrokerUnderTest {
 public:
  explicit StreamUnderTest(std::unique_ptr<test::PrivateRedis> own = nullptr)
      : own_(std::move(own)),
        address_(own_ ? own_->address() : test::server()),
        stream_(test::unique_stream("conformance")) {}

  ~StreamUnderTest() override {
    try {
      test::RawRedis(address_).call({"DEL", stream_, stream_ + ":dead-letter"});
    } catch (const std::exception& e) {
      ADD_FAILURE() << "could not delete the test stream: " << e.what();
    }
  }

  std::unique_ptr<MessageSink> sink() override {
    auto sink = open_redis_stream_sink(test::stream_url(address_, stream_), {});
    if (!sink) throw std::runtime_error("open sink: " + sink.error().message);
    return std::move(*sink);
  }

  std::unique_ptr<MessageSource> source(const SourceSettings& settings) override {
    auto source = open_redis_stream_source(test::stream_url(address_, stream_, "group=conformance"), settings);
    if (!source) throw std::runtime_error("open source: " + source.error().message);
    return std::move(*source);
  }

  std::vector<testing::DeadLetter> take_dead_letters() override {
    const std::string key = stream_ + ":dead-letter";
    auto entries = parse_entries(call({"XRANGE", key, "-", "+"}));
    if (!entries) throw std::runtime_error(entries.error());
    std::vector<testing::DeadLetter> out;
    for (auto& entry : *entries) {
      Delivery d;
      if (!entry.fields || !decode_fields(*entry.fields, d)) throw std::runtime_error("dead letter " + entry.id);
      testing::DeadLetter dead{d.message_id, d.body, "", ""};
      // The reason fields come back as headers (fields outside the message encoding).
      for (const auto& [name, value] : d.headers) {
        if (name == "reason") dead.reason = value;
        if (name == "last_error") dead.last_error = value;
      }
      out.push_back(std::move(dead));
    }
    call({"DEL", key});
    return out;
  }

  // Pending (delivered, not acked) plus lag (not yet delivered to the group).
  std::size_t outstanding() override {
    auto groups = call({"XINFO", "GROUPS", stream_});
    for (const Reply& group : groups.elements) {
      long long pending = -1, lag = -1;
      std::string name;
      for (std::size_t i = 0; i + 1 < group.elements.size(); i += 2) {
        const std::string& field = group.elements[i].str;
        const Reply& value = group.elements[i + 1];
        if (field == "name") name = value.str;
        if (field == "pending") pending = value.integer;
        if (field == "lag" && value.type == Reply::Type::integer) lag = value.integer;
      }
      if (name != "conformance") continue;
      if (pending < 0 || lag < 0) throw std::runtime_error("XINFO GROUPS gave no pending/lag count");
      return static_cast<std::size_t>(pending + lag);
    }
    return static_cast<std::size_t>(call({"XLEN", stream_}).integer);  // no group yet: all of it
  }

  void restart_broker() override {
    if (!own_) throw std::runtime_error("only the restart suite restarts a (private) server");
    own_->stop();
    own_->start();
  }

 private:
  // A connection of its own each time: one kept would not survive restart_broker.
  Reply call(const std::vector<std::string>& args) {
    auto r = test::RawRedis(address_).call(args);
    if (r.is_error()) throw std::runtime_error(args.front() + ": " + r.str);
    return r;
  }

  std::unique_ptr<test::PrivateRedis> own_;
  redis_detail::Address address_;
  std::string stream_;
};

using testing::BrokerConformance;
using testing::BrokerRestartConformance;

INSTANTIATE_TEST_SUITE_P(RedisStreams, BrokerConformance,
                         ::testing::Values(testing::BrokerFactory{"redis_streams",
                                                                  [] { return std::make_unique<StreamUnderTest>(); }}),
                         testing::BrokerConformance::name_of);

INSTANTIATE_TEST_SUITE_P(RedisStreams, BrokerRestartConformance,
                         ::testing::Values(testing::BrokerFactory{"redis_streams",
                                                                  [] {
                                                                    (void)test::server();  // CI: fail, never skip
                                                                    return std::make_unique<StreamUnderTest>(
                                                                        std::make_unique<test::PrivateRedis>());
                                                                  }}),
                         testing::BrokerRestartConformance::name_of);

}  // namespace
}  // namespace idem::redis_streams
