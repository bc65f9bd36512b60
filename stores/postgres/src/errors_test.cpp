#include "errors.hpp"

#include <gtest/gtest.h>

namespace idem::postgres_detail {
namespace {

const Exchange kRead{"get", false, false};
const Exchange kWriteUnsent{"batch", true, false};
const Exchange kWriteSent{"batch", true, true};

TEST(PostgresErrors, ConnectionLostPoisonsAndIsInDoubtOnlyOnceTheCommitMayHaveRun) {
  auto f = map_error(Cause::connection_lost, "", "server closed the connection unexpectedly", kWriteSent);
  EXPECT_EQ(f.error.code, StoreErrc::unavailable);
  EXPECT_TRUE(f.poison);
  EXPECT_TRUE(f.error.in_doubt);
  EXPECT_TRUE(f.error.retryable());
  EXPECT_NE(f.error.message.find("may or may not"), std::string::npos);
  EXPECT_FALSE(map_error(Cause::connection_lost, "", "x", kWriteUnsent).error.in_doubt);
  EXPECT_FALSE(map_error(Cause::connection_lost, "", "x", kRead).error.in_doubt);
}

TEST(PostgresErrors, ClientTimeoutIsATimeoutAndAbandonsTheConnection) {
  auto f = map_error(Cause::client_timeout, "", "no answer", kWriteSent);
  EXPECT_EQ(f.error.code, StoreErrc::timeout);
  EXPECT_TRUE(f.poison);
  EXPECT_TRUE(f.error.in_doubt);
  EXPECT_FALSE(map_error(Cause::client_timeout, "", "no answer", kRead).error.in_doubt);
}

TEST(PostgresErrors, SerializationFailureAndDeadlockAreRetried) {
  for (const char* state : {"40001", "40P01"}) {
    auto f = map_error(Cause::server, state, "could not serialize", kWriteSent);
    EXPECT_TRUE(f.retry) << state;
    EXPECT_FALSE(f.poison) << state;
    EXPECT_FALSE(f.error.in_doubt) << state;  // the server said the transaction aborted
    EXPECT_EQ(f.error.code, StoreErrc::unavailable) << state;
  }
}

TEST(PostgresErrors, StatementTimeoutIsATimeoutNotInDoubt) {
  auto f = map_error(Cause::server, "57014", "canceling statement due to statement timeout", kWriteSent);
  EXPECT_EQ(f.error.code, StoreErrc::timeout);
  EXPECT_FALSE(f.poison);
  EXPECT_FALSE(f.error.in_doubt);
  EXPECT_EQ(map_error(Cause::server, "55P03", "lock timeout", kWriteSent).error.code, StoreErrc::timeout);
}

TEST(PostgresErrors, ShutdownEndsTheSessionAndKeepsTheDoubtAroundACommit) {
  for (const char* state : {"57P01", "57P02", "57P03", "08006", "08003", "25P03"}) {
    auto f = map_error(Cause::server, state, "terminating connection", kWriteSent);
    EXPECT_EQ(f.error.code, StoreErrc::unavailable) << state;
    EXPECT_TRUE(f.poison) << state;
    EXPECT_TRUE(f.error.in_doubt) << state;
    EXPECT_FALSE(map_error(Cause::server, state, "x", kWriteUnsent).error.in_doubt) << state;
  }
}

TEST(PostgresErrors, ServerTroubleIsUnavailable) {
  for (const char* state : {"53100", "53300", "58030", "28P01", "3D000", "42501", "25006"}) {
    EXPECT_EQ(map_error(Cause::server, state, "x", kRead).error.code, StoreErrc::unavailable) << state;
  }
  EXPECT_TRUE(map_error(Cause::server, "25006", "read-only", kRead).poison);  // look for the primary
}

TEST(PostgresErrors, RefusedDataIsInternalAndIsolatedFromItsBatch) {
  for (const char* state : {"22021", "23514", "22003", "P0001"}) {
    auto f = map_error(Cause::server, state, "refused", kWriteSent);
    EXPECT_EQ(f.error.code, StoreErrc::internal) << state;
    EXPECT_TRUE(f.isolate) << state;
    EXPECT_FALSE(f.poison) << state;
    EXPECT_FALSE(f.error.in_doubt) << state;
    EXPECT_FALSE(f.error.retryable()) << state;
  }
}

TEST(PostgresErrors, SchemaTroubleReconnectsAndCorruptionIsCorrupt) {
  auto f = map_error(Cause::server, "42P01", "relation does not exist", kRead);
  EXPECT_EQ(f.error.code, StoreErrc::internal);
  EXPECT_TRUE(f.poison);
  EXPECT_EQ(map_error(Cause::server, "XX001", "bad block", kRead).error.code, StoreErrc::corrupt);
}

TEST(PostgresErrors, MessageSaysWhatAndWhy) {
  auto f = map_error(Cause::server, "23505", "duplicate key value\n", Exchange{"claim", true, true});
  EXPECT_EQ(f.error.message, "postgres: claim: duplicate key value (SQLSTATE 23505)");
}

}  // namespace
}  // namespace idem::postgres_detail
