// A gRPC echo service for bench/gateway/grpc.sh, with gRPC's generic callback API (no protoc,
// no .proto): every method answers its one request message back unchanged, as a unary call,
// and counts the call. One method of its own, /idem.bench.Echo/Count (not counted), answers the
// number of calls answered so far as decimal ASCII, so that the benchmark can prove the service
// executed exactly the calls it expected (a gateway that replayed instead would be caught).
//
// usage: idem-grpc-echo-server [--listen HOST:PORT] [--port-file FILE] [--threads N]
//   --listen     where to listen, insecure (h2c); default 127.0.0.1:0 (a free port)
//   --port-file  the port chosen, written (then renamed into place) once the server listens
//   --threads    gRPC's thread quota (ResourceQuota::SetMaxThreads); gRPC 1.51 runs callback
//                handlers on its own poller threads, which this does not bound: 0 (default)
//                leaves gRPC's defaults alone
// SIGTERM or SIGINT: shuts down (calls in flight get 1 s), prints the count on stderr, exits 0.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

namespace {

constexpr std::string_view count_method = "/idem.bench.Echo/Count";

std::atomic<unsigned long long> calls{0};

// One call: read the request message, write it back and finish with OK (unary semantics over
// the generic bidi reactor). The request arrives whole before the reactor answers.
class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit EchoReactor(grpc::GenericCallbackServerContext* context) : context_(context) { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // no message: the client half-closed or cancelled before sending one
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a unary call needs one request message"));
      return;
    }
    if (context_->method() == count_method) {
      std::string text = std::to_string(calls.load(std::memory_order_relaxed));
      grpc::Slice slice(text);
      response_ = grpc::ByteBuffer(&slice, 1);
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    calls.fetch_add(1, std::memory_order_relaxed);
    StartWriteAndFinish(&request_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  grpc::GenericCallbackServerContext* context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    return new EchoReactor(context);
  }
};

volatile std::sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "idem-grpc-echo-server: " << why << "\n"
            << "usage: idem-grpc-echo-server [--listen HOST:PORT] [--port-file FILE] [--threads N]\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  std::string port_file;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "--listen") {
      listen = value();
    } else if (arg == "--port-file") {
      port_file = value();
    } else if (arg == "--threads") {
      std::string v = value();
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0 || n > 1024) usage("--threads: expected 0-1024, got \"" + v + "\"");
      threads = static_cast<int>(n);
    } else if (arg == "-h" || arg == "--help") {
      usage("an echo gRPC service (bench/gateway/grpc.sh)");
    } else {
      usage("unknown argument: " + std::string(arg));
    }
  }

  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  // Messages up to 64 MiB either way (the benchmark chooses the size).
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  if (threads > 0) {
    grpc::ResourceQuota quota("idem-grpc-echo-server");
    quota.SetMaxThreads(threads);
    builder.SetResourceQuota(quota);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "idem-grpc-echo-server: cannot listen on " << listen << "\n";
    return 1;
  }

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  if (!port_file.empty()) {
    std::string tmp = port_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << port << "\n";
      if (!out) {
        std::cerr << "idem-grpc-echo-server: cannot write " << tmp << "\n";
        return 1;
      }
    }
    if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      std::cerr << "idem-grpc-echo-server: cannot rename " << tmp << " to " << port_file << "\n";
      return 1;
    }
  }
  std::cerr << "idem-grpc-echo-server: listening on port " << port << "\n";

  while (!stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  std::cerr << "idem-grpc-echo-server: " << calls.load() << " calls answered\n";
  return 0;
}
