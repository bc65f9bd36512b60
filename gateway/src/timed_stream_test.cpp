#include "timed_stream.hpp"

#include <gtest/gtest.h>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include <array>
#include <chrono>
#include <optional>

namespace idem::gateway {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A loopback connection: `stream` (a TimedStream) on one end, a plain socket on the other, and
// the event loop's sweep every 5 ms, as watch_deadlines runs it.
class TimedStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    Socket client(io.get_executor());
    client.connect(acceptor.local_endpoint());
    acceptor.accept(peer);
    stream.emplace(deadlines, std::move(client));
    sweep();
  }

  void sweep() {
    sweeper.expires_after(5ms);
    sweeper.async_wait([this](const beast::error_code& ec) {
      if (ec) return;
      deadlines.sweep(Clock::now());
      sweep();
    });
  }

  // Runs the loop until `done` holds or 5 s pass.
  template <class Done>
  void run_until(Done done) {
    const auto give_up = Clock::now() + 5s;
    while (!done() && Clock::now() < give_up) io.run_for(5ms);
  }

  asio::io_context io;
  Deadlines deadlines;
  tcp::socket peer{io};
  std::optional<TimedStream> stream;
  asio::steady_timer sweeper{io};
  std::array<char, 64> data{};
};

TEST_F(TimedStreamTest, AReadPastItsDeadlineTimesOutAndClosesTheSocket) {
  std::optional<beast::error_code> result;
  const auto start = Clock::now();
  stream->expires_after(50ms);
  stream->async_read_some(asio::buffer(data), [&](beast::error_code ec, std::size_t) { result = ec; });
  run_until([&] { return result.has_value(); });
  ASSERT_TRUE(result);
  EXPECT_EQ(*result, beast::error::timeout);
  EXPECT_GE(Clock::now() - start, 50ms);
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_FALSE(stream->socket().is_open());
}

TEST_F(TimedStreamTest, AReadThatCompletesInTimeIsNotCut) {
  std::optional<beast::error_code> result;
  std::size_t got = 0;
  stream->expires_after(2s);
  stream->async_read_some(asio::buffer(data), [&](beast::error_code ec, std::size_t n) {
    result = ec;
    got = n;
  });
  asio::write(peer, asio::buffer("hello", 5));
  run_until([&] { return result.has_value(); });
  ASSERT_TRUE(result);
  EXPECT_FALSE(*result) << result->message();
  EXPECT_EQ(got, 5u);
}

// A session waits on the upstream with its client stream's deadline long past: nothing is
// pending on that stream, so nothing may close it.
TEST_F(TimedStreamTest, APassedDeadlineWithNothingPendingClosesNothing) {
  stream->expires_after(10ms);
  io.run_for(100ms);  // twenty sweeps past the deadline
  ASSERT_TRUE(stream->socket().is_open());

  std::optional<beast::error_code> result;
  stream->expires_after(2s);
  stream->async_read_some(asio::buffer(data), [&](beast::error_code ec, std::size_t) { result = ec; });
  asio::write(peer, asio::buffer("late", 4));
  run_until([&] { return result.has_value(); });
  ASSERT_TRUE(result);
  EXPECT_FALSE(*result) << result->message();
}

TEST_F(TimedStreamTest, ExpiresNeverLetsAReadWait) {
  std::optional<beast::error_code> result;
  stream->expires_after(10ms);
  stream->expires_never();
  stream->async_read_some(asio::buffer(data), [&](beast::error_code ec, std::size_t) { result = ec; });
  io.run_for(100ms);
  EXPECT_FALSE(result);
  asio::write(peer, asio::buffer("x", 1));
  run_until([&] { return result.has_value(); });
  ASSERT_TRUE(result);
  EXPECT_FALSE(*result) << result->message();
}

TEST_F(TimedStreamTest, CancelIsNotATimeout) {
  std::optional<beast::error_code> result;
  stream->expires_after(2s);
  stream->async_read_some(asio::buffer(data), [&](beast::error_code ec, std::size_t) { result = ec; });
  io.poll();
  stream->cancel();
  run_until([&] { return result.has_value(); });
  ASSERT_TRUE(result);
  EXPECT_EQ(*result, asio::error::operation_aborted);
  EXPECT_TRUE(stream->socket().is_open());
}

// Through Beast's composed read, as the gateway reads requests: a client that sends part of its
// header and stalls gets beast::error::timeout, the error the gateway maps to a dropped client.
TEST_F(TimedStreamTest, AStalledHttpReadTimesOut) {
  beast::flat_buffer buffer;
  beast::http::request_parser<beast::http::string_body> parser;
  std::optional<beast::error_code> result;
  stream->expires_after(50ms);
  beast::http::async_read_header(*stream, buffer, parser, [&](beast::error_code ec, std::size_t) { result = ec; });
  asio::write(peer, asio::buffer("POST / HTTP/1.1\r\nHost: x\r\n", 26));
  run_until([&] { return result.has_value(); });
  ASSERT_TRUE(result);
  EXPECT_EQ(*result, beast::error::timeout);
}

}  // namespace
}  // namespace idem::gateway
