// ControlEndpoint on the wire, over raw sockets: requests as curl sends them and as no client should (malformed
// request lines, heads over the limit, unknown methods, bodies over max_body_bytes whether sized, chunked or without
// a length). Each gets its status at once, and none grows the training process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/sanitizers.h"
#include "tests/unit/control_endpoint_test_support.h"

namespace bridge::training {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using namespace std::chrono_literals;
using testing::ControlEndpointTest;
using testing::header_value;
using testing::memory_kib;
using testing::RawClient;
using testing::reset_peak_memory;

// curl -X POST .../stop sends no Content-Length and no Transfer-Encoding: a body of length 0 (RFC 9112 section 6.3),
// so the reply comes at once, with the connection left open as curl leaves it, and the stop reaches the loop.
TEST_F(ControlEndpointTest, ABodylessPostAsCurlSendsItIsActedOnAtOnce) {
  start();
  RawClient curl(endpoint_->port());
  ASSERT_TRUE(curl.connected());
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(curl.send("POST /stop HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(endpoint_->port()) +
                        "\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"));
  const RawClient::Response reply = curl.read_response();
  const auto waited = std::chrono::steady_clock::now() - sent;
  EXPECT_EQ(reply.status, 202) << reply.head;
  EXPECT_LT(waited, 1s) << "the server waited for a body that the request does not have";
  EXPECT_EQ(nlohmann::json::parse(reply.body)["after_step"], 1);
  const std::vector<ControlRequest> requests = step_end();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].action, ControlAction::kStop);
  EXPECT_EQ(requests[0].reason, "POST /stop from 127.0.0.1");
}

// How much a 96 MiB body may grow the process while it is refused: a sixth of it, or half under ASan, whose
// quarantine keeps the freed read buffers resident (measured: 20-25 MiB with clang's).
constexpr long kGrowthBoundKib = (bridge::testing::kAddressSanitizer ? 48 : 16) * 1024;

// Streams `megabytes` MiB after `head` (in 64 KiB pieces, as chunks when `chunked`) until the server stops reading,
// and returns the reply; the process's peak memory must not grow by more than a small bound meanwhile.
RawClient::Response stream_body(int port, const std::string& head, int megabytes, bool chunked, long* grown_kib) {
  const bool measured = reset_peak_memory();
  const long before = memory_kib("VmRSS");
  RawClient client(port);
  EXPECT_TRUE(client.connected());
  const std::string piece(64 * 1024, 'x');
  const std::string chunk = chunked ? "10000\r\n" + piece + "\r\n" : piece;
  bool open = client.send(head);
  for (int i = 0; open && i < megabytes * 16; ++i) open = client.send(chunk);
  if (open && chunked) client.send("0\r\n\r\n");
  RawClient::Response reply = client.read_response();
  *grown_kib = measured ? memory_kib("VmHWM") - before : -1;
  return reply;
}

TEST_F(ControlEndpointTest, AChunkedBodyOverTheLimitIsRefusedWhileReadWithoutGrowingTheProcess) {
  start();  // max_body_bytes 4096
  long grown_kib = 0;
  const RawClient::Response reply =
      stream_body(endpoint_->port(), "POST /save HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n", 96,
                  true, &grown_kib);
  EXPECT_EQ(reply.status, 413) << reply.head;
  EXPECT_THAT(reply.body, HasSubstr("over 4096 bytes (ControlEndpoint.max_body_bytes)"));
  if (grown_kib >= 0) {
    EXPECT_LT(grown_kib, kGrowthBoundKib) << "the body was held in memory";
  }
  EXPECT_THAT(step_end(), IsEmpty());
  // A small chunked body is fine.
  RawClient small(endpoint_->port());
  ASSERT_TRUE(
      small.send("POST /save HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "6\r\nbefore\r\n8\r\n the end\r\n0\r\n\r\n"));
  EXPECT_EQ(small.read_response().status, 202);
  const std::vector<ControlRequest> requests = step_end();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].reason, "POST /save from 127.0.0.1: before the end");
  if (grown_kib < 0) GTEST_SKIP() << "/proc/self/clear_refs is not writable here: the memory bound was not measured";
}

// Bytes after a POST without Content-Length or Transfer-Encoding are not its body but the next request's head: the
// POST is served as bodyless, and the rest (no line end in 96 MiB) is refused as a head over the limit, unread.
TEST_F(ControlEndpointTest, BytesAfterAPostWithoutALengthAreNotReadAsItsBody) {
  start();
  long grown_kib = 0;
  RawClient client(endpoint_->port());
  const bool measured = reset_peak_memory();
  const long before = memory_kib("VmRSS");
  ASSERT_TRUE(client.send("POST /save HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  const std::string piece(64 * 1024, 'x');
  bool open = true;
  for (int i = 0; open && i < 96 * 16; ++i) open = client.send(piece);
  const RawClient::Response saved = client.read_response();
  const RawClient::Response rest = client.read_response();
  grown_kib = measured ? memory_kib("VmHWM") - before : -1;
  EXPECT_EQ(saved.status, 202) << saved.head;
  EXPECT_EQ(rest.status, 431) << rest.head;
  EXPECT_TRUE(client.closed_by_server());
  if (grown_kib >= 0) {
    EXPECT_LT(grown_kib, kGrowthBoundKib) << "the bytes were held in memory";
  }
  const std::vector<ControlRequest> requests = step_end();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].reason, "POST /save from 127.0.0.1") << "the bytes after it were taken as its body";
  // A body declared over the limit is refused before it is read, even when the client sends it anyway.
  const RawClient::Response sized =
      stream_body(endpoint_->port(), "POST /save HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100663296\r\n\r\n", 96,
                  false, &grown_kib);
  EXPECT_EQ(sized.status, 413) << sized.head;
  if (grown_kib >= 0) {
    EXPECT_LT(grown_kib, kGrowthBoundKib) << "the body was held in memory";
  }
  EXPECT_THAT(step_end(), IsEmpty());
}

// What no client should send gets a status, not a dropped connection; the server serves on.
TEST_F(ControlEndpointTest, MalformedRequestsGetAStatusNotADroppedConnection) {
  start();
  const auto exchange = [this](const std::string& request) {
    RawClient client(endpoint_->port());
    EXPECT_TRUE(client.connected());
    client.send(request);
    return client.read_response();
  };
  EXPECT_EQ(exchange("GARBAGE\r\n\r\n").status, 400);
  EXPECT_EQ(exchange("\x01\x02 NOT-HTTP \xff\r\n\r\n").status, 400);
  EXPECT_EQ(exchange("POST /stop HTTP/1.1\r\n\r\n").status, 400) << "HTTP/1.1 needs Host";
  EXPECT_EQ(exchange("GET /status HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100 * 1024, 'a') + "\r\n\r\n").status,
            431);
  const RawClient::Response patch = exchange("PATCH /stop HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(patch.status, 405);
  EXPECT_EQ(header_value(patch.head, "Allow"), "POST");
  const RawClient::Response brew = exchange("BREW /status HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(brew.status, 405);
  EXPECT_EQ(header_value(brew.head, "Allow"), "GET, HEAD");
  EXPECT_EQ(exchange("PATCH /nowhere HTTP/1.1\r\nHost: x\r\n\r\n").status, 404);
  EXPECT_EQ(exchange("GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n").status, 404) << "a path that is not UTF-8";
  RawClient head_client(endpoint_->port());
  head_client.send("HEAD /status HTTP/1.1\r\nHost: x\r\n\r\n");
  const RawClient::Response head = head_client.read_response(/*head_request=*/true);
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
  EXPECT_GT(std::stoi(header_value(head.head, "Content-Length")), 0);
  EXPECT_THAT(step_end(), IsEmpty());  // none of it queued anything
  EXPECT_EQ(client_->Get("/status")->status, 200);
}

// Expect: 100-continue (curl sends it before large bodies): the go-ahead when the body will be read, at once a 413
// when its length is over the limit (the client then never sends it).
TEST_F(ControlEndpointTest, ExpectContinueGetsTheGoAheadOrAnEarly413) {
  start();
  RawClient client(endpoint_->port());
  ASSERT_TRUE(client.send("POST /save HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(client.read_response().status, 100);
  ASSERT_TRUE(client.send("late"));
  EXPECT_EQ(client.read_response().status, 202);
  RawClient big(endpoint_->port());
  ASSERT_TRUE(big.send("POST /save HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(big.read_response().status, 413);
  const std::vector<ControlRequest> requests = step_end();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].reason, "POST /save from 127.0.0.1: late");
}

// Connections past the limit (32) get 503 at once instead of a thread or a queue slot each; closed ones free theirs.
TEST_F(ControlEndpointTest, ConnectionsPastTheLimitGet503) {
  start();
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 32; ++i) idle.push_back(std::make_unique<RawClient>(endpoint_->port()));
  RawClient extra(endpoint_->port());
  extra.send("GET /status HTTP/1.1\r\nHost: x\r\n\r\n");
  const RawClient::Response busy = extra.read_response();
  EXPECT_EQ(busy.status, 503) << busy.head;
  idle.clear();
  int status = 0;
  for (int attempt = 0; attempt < 100 && status != 200; ++attempt) {  // the server sees the closes within moments
    std::this_thread::sleep_for(10ms);
    if (const auto reply = client_->Get("/status")) status = reply->status;
  }
  EXPECT_EQ(status, 200);
}

}  // namespace
}  // namespace bridge::training
