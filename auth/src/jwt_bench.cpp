// What verifying a bearer token costs: uncached (a signature check; every request of a client
// with a new token pays it once per event loop) per algorithm, against a cache hit (what every
// further request with the same token pays) in the same run.
//
//   build/.../auth/idem_jwt_bench [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "idem/auth/jwt.hpp"
#include "test_tokens.hpp"

namespace {

using idem::auth::Algorithm;
using idem::auth::JwtOptions;
using idem::auth::JwtVerifier;
using idem::auth::KeySet;
namespace test = idem::auth::test;

constexpr std::string_view kSecret = "bench-secret-0123456789abcdef-0123456789";

// A realistic access token: iss, sub, aud, scopes, ~600 bytes once signed with RS256.
std::string payload() {
  return R"({"iss":"https://auth.example","sub":"user-0123456789","aud":"payments-api","iat":1767225600,)"
         R"("exp":4102444800,"scope":"payments:read payments:write","client_id":"mobile-app","jti":"b1c2d3e4"})";
}

struct Fixture {
  Fixture() {
    char tmpl[] = "/tmp/idem-jwt-bench-XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~Fixture() { std::filesystem::remove_all(dir); }
  std::string dir;
  test::TestKey rsa = test::TestKey::rsa(2048);
  test::TestKey ec = test::TestKey::ec("P-256");

  std::shared_ptr<const KeySet> keys(Algorithm alg, std::size_t cache_size) {
    JwtOptions o;
    o.cache_size = cache_size;
    o.algorithms = {alg};
    o.audience = "payments-api";
    if (alg == Algorithm::HS256) {
      o.secret_file = dir + "/secret";
      test::write_file(o.secret_file, kSecret);
    } else {
      o.key_files = {dir + "/jwks.json"};
      test::write_file(o.key_files[0], test::jwk_set({rsa.public_jwk("rsa"), ec.public_jwk("ec")}));
    }
    return KeySet::load(o).value();
  }

  std::string token(Algorithm alg) {
    switch (alg) {
      case Algorithm::RS256:
        return rsa.sign("RS256", R"({"alg":"RS256","kid":"rsa","typ":"JWT"})", payload());
      case Algorithm::ES256:
        return ec.sign("ES256", R"({"alg":"ES256","kid":"ec","typ":"JWT"})", payload());
      default:
        return test::sign_hmac("HS256", R"({"alg":"HS256","typ":"JWT"})", payload(), kSecret);
    }
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void run(benchmark::State& state, Algorithm alg, bool cached) {
  JwtVerifier v(fixture().keys(alg, cached ? 16 : 0));
  const std::string token = fixture().token(alg);
  if (!v.verify(token)) {
    state.SkipWithError("the benchmark token does not verify");
    return;
  }
  for (auto _ : state) {
    auto r = v.verify(token);
    benchmark::DoNotOptimize(r);
  }
  state.SetLabel(std::to_string(token.size()) + " byte token");
}

void BM_Uncached_RS256(benchmark::State& s) { run(s, Algorithm::RS256, false); }
void BM_Uncached_ES256(benchmark::State& s) { run(s, Algorithm::ES256, false); }
void BM_Uncached_HS256(benchmark::State& s) { run(s, Algorithm::HS256, false); }
void BM_Cached_RS256(benchmark::State& s) { run(s, Algorithm::RS256, true); }

BENCHMARK(BM_Uncached_RS256);
BENCHMARK(BM_Uncached_ES256);
BENCHMARK(BM_Uncached_HS256);
BENCHMARK(BM_Cached_RS256);

}  // namespace

BENCHMARK_MAIN();
