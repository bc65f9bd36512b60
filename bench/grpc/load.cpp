// A gRPC unary-call load generator for bench/gateway/grpc.sh, with gRPC's generic stub (no
// protoc): N calls of one method, C at a time, over K channels (each its own HTTP/2 connection),
// driven by one thread on one CompletionQueue. Each call carries the metadata `idempotency-key`:
// unique per call (a random prefix per run and a counter, shaped like a UUID) unless --same-key
// or --key. Every answer must be OK and echo the request message back byte for byte (the
// echo server does; a replay from the gateway must too); anything else is an error.
//
// Prints one JSON line on stdout: calls/s (from the first call sent to the last answered), the
// errors by gRPC status name (and "bad_response" for an OK whose message differs), how many
// answers said `idempotent-replayed: true`, p50/p99/max latency in microseconds, and this
// process's own CPU (user + system) per call. Exits 1 if any call failed, unless
// --expect-failures.
//
// usage: idem-grpc-load --target HOST:PORT [--method /pkg.Service/Method] [--calls N]
//                       [--concurrency C] [--channels K] [--message-bytes B]
//                       [--same-key | --key KEY] [--deadline-ms MS] [--expect-failures]
//        idem-grpc-load --target HOST:PORT --count
//   --method       default /payments.Payments/Charge
//   --calls        default 10000; --concurrency default 64; --channels default 4
//   --message-bytes  the request message's size (default 256), the same bytes in every call
//   --same-key     one random key for every call of this run; --key KEY: that key
//   --deadline-ms  each call's deadline (default 10000), sent as grpc-timeout
//   --count        asks idem-grpc-echo-server how many calls it answered (/idem.bench.Echo/Count)
//                  and prints the number
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "idem-grpc-load: " << why << "\n"
            << "usage: idem-grpc-load --target HOST:PORT [--method /pkg.Service/Method] [--calls N]\n"
            << "         [--concurrency C] [--channels K] [--message-bytes B] [--same-key | --key KEY]\n"
            << "         [--deadline-ms MS] [--expect-failures]\n"
            << "       idem-grpc-load --target HOST:PORT --count\n";
  std::exit(2);
}

long positive(std::string_view name, const std::string& v, long max) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 1 || n > max)
    usage(std::string(name) + ": expected 1-" + std::to_string(max) + ", got \"" + v + "\"");
  return n;
}

const char* status_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "STATUS_UNKNOWN_CODE";
  }
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return sec(usage.ru_utime) + sec(usage.ru_stime);
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  // A connection per channel: channels with equal arguments would share one subchannel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("idem.bench.channel", index);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::cerr << "idem-grpc-load: channel " << index << " to " << target << " not connected within 10 s\n";
    std::exit(1);
  }
  return channel;
}

// One call in flight: what its completion needs.
struct Slot {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientAsyncResponseReader<grpc::ByteBuffer>> reader;
  grpc::ByteBuffer response;
  grpc::Status status;
  Clock::time_point start;
};

}  // namespace

int main(int argc, char** argv) {
  std::string target;
  std::string method = "/payments.Payments/Charge";
  long calls = 10000, concurrency = 64, channels = 4, message_bytes = 256, deadline_ms = 10000;
  bool same_key = false, expect_failures = false, count = false;
  std::string fixed_key;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "--target") target = value();
    else if (arg == "--method") method = value();
    else if (arg == "--calls") calls = positive(arg, value(), 1'000'000'000);
    else if (arg == "--concurrency") concurrency = positive(arg, value(), 100'000);
    else if (arg == "--channels") channels = positive(arg, value(), 1000);
    else if (arg == "--message-bytes") message_bytes = positive(arg, value(), 32 << 20);
    else if (arg == "--deadline-ms") deadline_ms = positive(arg, value(), 3'600'000);
    else if (arg == "--same-key") same_key = true;
    else if (arg == "--key") { fixed_key = value(); same_key = true; }
    else if (arg == "--expect-failures") expect_failures = true;
    else if (arg == "--count") count = true;
    else if (arg == "-h" || arg == "--help") usage("gRPC unary calls with idempotency keys (bench/gateway/grpc.sh)");
    else usage("unknown argument: " + std::string(arg));
  }
  if (target.empty()) usage("--target is required");
  if (method.empty() || method[0] != '/') usage("--method: expected /package.Service/Method");

  if (count) {
    auto channel = make_channel(target, 0);
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer request(nullptr, 0), response;
    grpc::CompletionQueue cq;
    grpc::Status status;
    auto reader = stub.PrepareUnaryCall(&context, "/idem.bench.Echo/Count", request, &cq);
    reader->StartCall();
    reader->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok) || !ok || !status.ok()) {
      std::cerr << "idem-grpc-load: /idem.bench.Echo/Count failed: " << status_name(status.error_code()) << " "
                << status.error_message() << "\n";
      return 1;
    }
    std::cout << flatten(response) << "\n";
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return 0;
  }

  // The request message: the same bytes in every call (a replay's fingerprint must match).
  std::string payload(static_cast<size_t>(message_bytes), '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>('a' + i % 26);
  grpc::Slice payload_slice(payload);
  grpc::ByteBuffer request(&payload_slice, 1);

  // Keys shaped like a UUID: 8-4-4-4 random hex per run, then a 12-hex-digit call counter.
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  char prefix[40];
  uint64_t r1 = rng(), r2 = rng();
  std::snprintf(prefix, sizeof prefix, "%08x-%04x-4%03x-%04x-", static_cast<unsigned>(r1 & 0xffffffff),
                static_cast<unsigned>((r1 >> 32) & 0xffff), static_cast<unsigned>((r1 >> 48) & 0xfff),
                static_cast<unsigned>(0x8000 | (r2 & 0x3fff)));
  auto key_for = [&](long n) -> std::string {
    if (!fixed_key.empty()) return fixed_key;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%012lx", prefix, same_key ? 0L : n);
    return buf;
  };

  std::vector<std::shared_ptr<grpc::Channel>> channel_list;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (long i = 0; i < channels; ++i) {
    channel_list.push_back(make_channel(target, static_cast<int>(i)));
    stubs.push_back(std::make_unique<grpc::GenericStub>(channel_list.back()));
  }

  grpc::CompletionQueue cq;
  long in_flight_max = std::min(concurrency, calls);
  std::vector<Slot> slots(static_cast<size_t>(in_flight_max));
  long issued = 0, done = 0, replayed = 0;
  std::map<std::string, long> errors;
  std::string first_error;
  std::vector<uint32_t> latencies_us;
  latencies_us.reserve(static_cast<size_t>(calls));

  auto issue = [&](size_t index) {
    Slot& slot = slots[index];
    slot.context = std::make_unique<grpc::ClientContext>();
    slot.context->AddMetadata("idempotency-key", key_for(issued));
    slot.context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    slot.response.Clear();
    slot.status = grpc::Status();
    auto& stub = *stubs[static_cast<size_t>(issued % channels)];
    slot.start = Clock::now();
    slot.reader = stub.PrepareUnaryCall(slot.context.get(), method, request, &cq);
    slot.reader->StartCall();
    slot.reader->Finish(&slot.response, &slot.status, reinterpret_cast<void*>(index + 1));
    ++issued;
  };

  double cpu0 = cpu_seconds();
  auto t0 = Clock::now();
  for (size_t i = 0; i < slots.size(); ++i) issue(i);
  while (done < calls) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    size_t index = reinterpret_cast<size_t>(tag) - 1;
    Slot& slot = slots[index];
    auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - slot.start).count();
    latencies_us.push_back(static_cast<uint32_t>(std::min<int64_t>(elapsed, UINT32_MAX)));
    ++done;
    std::string error;
    if (!ok) {
      error = "CQ_NOT_OK";
    } else if (!slot.status.ok()) {
      error = status_name(slot.status.error_code());
      if (first_error.empty()) first_error = error + ": " + slot.status.error_message();
    } else {
      if (flatten(slot.response) != payload) {
        error = "bad_response";
        if (first_error.empty()) first_error = "bad_response: the answer is not the request message";
      }
      const auto& metadata = slot.context->GetServerInitialMetadata();
      auto it = metadata.find("idempotent-replayed");
      if (it != metadata.end() && std::string_view(it->second.data(), it->second.size()) == "true") ++replayed;
    }
    if (!error.empty()) ++errors[error];
    if (issued < calls) issue(index);
  }
  auto t1 = Clock::now();
  double cpu1 = cpu_seconds();
  cq.Shutdown();
  {
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  }

  double seconds = std::chrono::duration<double>(t1 - t0).count();
  std::sort(latencies_us.begin(), latencies_us.end());
  auto percentile = [&](double p) -> uint32_t {
    if (latencies_us.empty()) return 0;
    size_t i = static_cast<size_t>(p * static_cast<double>(latencies_us.size() - 1) + 0.5);
    return latencies_us[std::min(i, latencies_us.size() - 1)];
  };
  long failed = 0;
  for (const auto& [name, n] : errors) failed += n;

  std::string errors_json = "{";
  for (const auto& [name, n] : errors) {
    if (errors_json.size() > 1) errors_json += ",";
    errors_json += "\"" + json_escape(name) + "\":" + std::to_string(n);
  }
  errors_json += "}";
  char line[1024];
  std::snprintf(line, sizeof line,
                "{\"target\":\"%s\",\"method\":\"%s\",\"keys\":\"%s\",\"calls\":%ld,\"concurrency\":%ld,"
                "\"channels\":%ld,\"message_bytes\":%ld,\"ok\":%ld,\"failed\":%ld,\"errors\":%s,\"replayed\":%ld,"
                "\"seconds\":%.3f,\"calls_per_s\":%.0f,\"p50_us\":%u,\"p99_us\":%u,\"max_us\":%u,"
                "\"client_cpu_us_per_call\":%.1f",
                json_escape(target).c_str(), json_escape(method).c_str(), same_key ? "same" : "unique", done,
                concurrency, channels, message_bytes, done - failed, failed, errors_json.c_str(), replayed, seconds,
                seconds > 0 ? static_cast<double>(done) / seconds : 0.0, percentile(0.50), percentile(0.99),
                percentile(1.0), done > 0 ? (cpu1 - cpu0) * 1e6 / static_cast<double>(done) : 0.0);
  std::string out = line;
  if (!first_error.empty()) out += ",\"first_error\":\"" + json_escape(first_error) + "\"";
  out += "}";
  std::cout << out << std::endl;
  if (done < calls) {
    std::cerr << "idem-grpc-load: the completion queue ended after " << done << " of " << calls << " calls\n";
    return 1;
  }
  return failed > 0 && !expect_failures ? 1 : 0;
}
