// Shared pieces of the ControlEndpoint tests: a fixture with one endpoint and the events the loop fires at it, a raw
// socket client for requests exactly as given, and this process's memory from /proc.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "training/callbacks/callback_manager.h"
#include "training/callbacks/control_endpoint.h"
#include "training/config/config.h"

namespace bridge::training::testing {

// A client on a raw socket, for requests exactly as given: what curl sends, and what no well-behaved client does.
class RawClient {
 public:
  explicit RawClient(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    const timeval wait{4, 0};  // under the test's budget, and under nothing the server waits for
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait));
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  // False once the server has closed (it refused what follows).
  bool send(const std::string& bytes) {
    for (std::size_t sent = 0; sent < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }
  // The next response: its head, and its body by Content-Length (none for HEAD); the status is 0 when none came
  // (closed, or 4 s).
  struct Response {
    int status = 0;
    std::string head, body;
  };
  Response read_response(bool head_request = false) {
    Response response;
    std::size_t end = std::string::npos;
    while ((end = pending_.find("\r\n\r\n")) == std::string::npos) {
      if (!receive()) return response;
    }
    response.head = pending_.substr(0, end + 2);
    pending_.erase(0, end + 4);
    std::smatch match;
    if (std::regex_search(response.head, match, std::regex("^HTTP/1\\.1 (\\d{3}) "))) {
      response.status = std::stoi(match[1]);
    }
    std::size_t length = 0;
    if (!head_request &&
        std::regex_search(response.head, match, std::regex("\r\nContent-Length: (\\d+)\r\n", std::regex::icase))) {
      length = std::stoul(match[1]);
    }
    while (pending_.size() < length) {
      if (!receive()) break;
    }
    response.body = pending_.substr(0, length);
    pending_.erase(0, std::min(length, pending_.size()));
    return response;
  }
  // Whether the server closed the connection (reads to its end, or for 4 s).
  bool closed_by_server() {
    while (receive()) {
    }
    return closed_;
  }

 private:
  bool receive() {
    char buffer[65536];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      closed_ = n == 0 || errno == ECONNRESET;
      return false;
    }
    pending_.append(buffer, static_cast<std::size_t>(n));
    return true;
  }

  int fd_;
  bool connected_ = false;
  bool closed_ = false;
  std::string pending_;
};

inline std::string header_value(const std::string& head, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(head, match, std::regex("\r\n" + name + ": ([^\r]*)\r\n", std::regex::icase))) return "";
  return match[1];
}

// This process's resident memory (VmRSS) or its peak (VmHWM), in KiB.
inline long memory_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

// Sets the peak back to the current resident size (Linux 4.0+), so a peak measured next is this test's own.
inline bool reset_peak_memory() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

// A manager with one ControlEndpoint and the events the loop fires at it.
class ControlEndpointTest : public ::testing::Test {
 protected:
  void start(ControlEndpointOptions options = {}) {
    endpoint_ = std::make_shared<ControlEndpoint>(std::move(options));
    manager_.add(endpoint_);
    config_.train.train_iters = 100;
    if (!keep_save_unset_) config_.checkpoint.save = "endpoint-test-saves";  // a /save is accepted; none is written
    state_.cfg = &config_;
    fire(Event::kTrainStart);
    ASSERT_GT(endpoint_->port(), 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", endpoint_->port());
    client_->set_connection_timeout(5);
    client_->set_read_timeout(5);
  }
  void TearDown() override {
    if (endpoint_ && endpoint_->port() > 0) fire(Event::kTrainEnd);
  }
  template <class Fill>
  void fire(Event event, Fill&& fill) {
    CallbackContext ctx(state_, model_, manager_.user_state());
    fill(ctx);
    manager_.fire(event, ctx);
  }
  void fire(Event event) {
    fire(event, [](CallbackContext&) {});
  }
  // A log step as the loop makes it: on_log, then the record complete.
  void log(std::map<std::string, double> metrics, std::optional<double> eta_seconds = std::nullopt) {
    LogRecord record;
    record.metrics = std::move(metrics);
    record.eta_seconds = eta_seconds;
    fire(Event::kLog, [&](CallbackContext& ctx) { ctx.log = &record; });
    record.complete();
  }
  // A step's end, where queued commands become requests; returns them.
  std::vector<ControlRequest> step_end() {
    fire(Event::kTrainStepEnd);
    state_.train_state.step += 1;
    return manager_.control().take();
  }

  bool keep_save_unset_ = false;  // start() leaves checkpoint.save empty
  CallbackManager manager_;
  ConfigContainer config_;
  GlobalState state_;
  ModelChunks model_;
  std::shared_ptr<ControlEndpoint> endpoint_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace bridge::training::testing
