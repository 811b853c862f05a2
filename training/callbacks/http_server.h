// HttpServer: the small HTTP/1.1 server behind ControlEndpoint, on Boost.Beast's request parser (Debian's
// libboost-dev), with every limit enforced while a request is read, so no request can grow the training process:
//
//   a head (request line and fields) over max_header_bytes     -> 431, closed; not read further
//   a request line or field that does not parse                -> 400, closed
//   a body over max_body_bytes, by Content-Length or chunked   -> 413, closed; the rest is never stored
//   no Content-Length and no Transfer-Encoding                 -> a body of length 0 (RFC 9112 section 6.3)
//   a head or body not read within `timeout`                   -> the connection is closed
//
// A request is first `screen`ed on its head alone (authentication, unknown paths, wrong methods), so a refused one's
// body is never read; one that passes is `serve`d with its body. Replies to requests whose body is left unread, or
// that could not be parsed, close the connection after a short lingering drain (so the client reads the reply rather
// than a reset). Boost stays out of this header.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bridge::training {
inline namespace callbacks {

struct HttpRequest {
  std::string method;       ///< as sent: "GET", "POST", "PATCH" or any other token
  std::string path;         ///< the target up to its query
  std::string remote_addr;  ///< the client's address
  std::string body;         ///< empty while the request is screened
  std::vector<std::pair<std::string, std::string>> headers;
  /// The first field named `name` (case-insensitive); empty when there is none.
  std::string header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  ///< more fields (Allow, WWW-Authenticate, ...)
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                             ///< 0: a free port; port() tells which
  std::size_t max_header_bytes = 8192;      ///< the request line and fields; more: 431
  std::uint64_t max_body_bytes = 4096;      ///< more: 413
  std::chrono::milliseconds timeout{5000};  ///< to read a head (or wait for the next one), a body, or write a reply
  int threads = 2;                          ///< threads serving every connection
  int max_connections = 32;                 ///< more at once get 503
};

struct HttpRoutes {
  /// Called with a request's head, before any of its body is read: a reply refuses the request.
  std::function<std::optional<HttpResponse>(const HttpRequest&)> screen;
  /// Called with a whole request that `screen` let through.
  std::function<HttpResponse(const HttpRequest&)> serve;
};

class HttpServer {
 public:
  /// Binds and starts serving; throws std::runtime_error naming the address when it cannot bind.
  HttpServer(HttpServerOptions options, HttpRoutes routes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// The port bound.
  int port() const noexcept;
  /// Stops accepting, drops every connection and joins the threads; returns at once when already stopped.
  void stop() noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace callbacks
}  // namespace bridge::training
