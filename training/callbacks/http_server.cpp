// HttpServer on Boost.Beast: one Session per connection on its own strand of a small io_context pool. Beast's parser
// enforces the head and body limits as it reads; the session only turns its errors into statuses and closes.
#include "training/callbacks/http_server.h"

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

namespace bridge::training {
inline namespace callbacks {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() && ::strncasecmp(key.data(), name.data(), name.size()) == 0) return value;
  }
  return {};
}

struct HttpServer::Impl {
  Impl(HttpServerOptions options_in, HttpRoutes routes_in)
      : options(std::move(options_in)), routes(std::move(routes_in)) {}
  void accept();

  const HttpServerOptions options;
  const HttpRoutes routes;
  // Before the io_context: sessions it still holds when it is destroyed count themselves out here.
  std::atomic<int> connections{0};
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
  int port = 0;  // read once bound: the acceptor is the threads' from then on
};

namespace {

std::string to_string(beast::string_view text) { return std::string(text.data(), text.size()); }

HttpResponse error_reply(int status, const std::string& message) {
  HttpResponse response;
  response.status = status;
  // Replacing bytes that are not UTF-8: the message may quote the client's.
  response.body =
      nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return response;
}

bool is_parse_error(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_method).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server)
      : stream_(std::move(socket)), server_(server), buffer_(kBufferBytes) {
    ++server_.connections;
    beast::error_code ec;
    const tcp::endpoint remote = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_addr_ = remote.address().to_string();
  }
  ~Session() { --server_.connections; }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start(bool over_limit) {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this(), over_limit] {
      if (over_limit) {
        self->reply(error_reply(503, "too many connections; try again"), /*close=*/true);
      } else {
        self->read_head();
      }
    });
  }

 private:
  // The head limit plus room for a pipelined request behind it; a body passes through in pieces.
  static constexpr std::size_t kBufferBytes = 64 * 1024;

  void read_head() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_.options.max_header_bytes));
    // The length is checked once the request is screened. (Not boost::none: Beast 1.74 then fails every
    // Content-Length, as it compares the length with the empty optional.)
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    request_ = HttpRequest{};
    head_ = false;
    stream_.expires_after(server_.options.timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::on_head, shared_from_this()));
  }

  void on_head(beast::error_code ec, std::size_t) {
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      return reply(error_reply(431, "the request line and header fields are over " +
                                        std::to_string(server_.options.max_header_bytes) + " bytes"),
                   /*close=*/true);
    }
    if (is_parse_error(ec)) return reply(error_reply(400, "malformed request: " + ec.message()), /*close=*/true);
    if (ec) return close();  // the client left, or was silent past the timeout
    const http::request<http::string_body>& head = parser_->get();
    request_.method = to_string(head.method_string());
    const std::string target = to_string(head.target());
    request_.path = target.substr(0, target.find('?'));
    request_.remote_addr = remote_addr_;
    for (const auto& field : head)
      request_.headers.emplace_back(to_string(field.name_string()), to_string(field.value()));
    keep_alive_ = head.keep_alive();
    if (head.version() >= 11 && head.find(http::field::host) == head.end()) {  // RFC 9112 section 3.2
      return reply(error_reply(400, "an HTTP/1.1 request needs a Host field"), /*close=*/true);
    }
    head_ = head.method() == http::verb::head;
    const bool body_follows = !parser_->is_done();
    std::optional<HttpResponse> refused;
    try {
      refused = server_.routes.screen(request_);
    } catch (const std::exception& error) {  // never out of io.run(), which would end the process
      refused = error_reply(500, error.what());
    }
    if (refused) return reply(*refused, /*close=*/!keep_alive_ || body_follows);
    if (!body_follows) return serve();
    const boost::optional<std::uint64_t> length = parser_->content_length();
    if (length && *length > server_.options.max_body_bytes) return refuse_body();
    const std::string expect = request_.header("Expect");
    if (!expect.empty() && ::strcasecmp(expect.c_str(), "100-continue") != 0) {
      return reply(error_reply(417, "Expect: " + expect + " is not supported; send 100-continue or none"),
                   /*close=*/true);
    }
    parser_->body_limit(server_.options.max_body_bytes);
    if (expect.empty()) return read_body();
    // The client waits for this before it sends the body.
    auto go_on = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
    stream_.expires_after(server_.options.timeout);
    http::async_write(stream_, *go_on, [self = shared_from_this(), go_on](beast::error_code write_ec, std::size_t) {
      if (write_ec) return self->close();
      self->read_body();
    });
  }

  void read_body() {
    stream_.expires_after(server_.options.timeout);
    http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&Session::on_body, shared_from_this()));
  }

  void on_body(beast::error_code ec, std::size_t) {
    if (ec == http::error::body_limit) return refuse_body();
    if (is_parse_error(ec)) return reply(error_reply(400, "malformed body: " + ec.message()), /*close=*/true);
    if (ec) return close();
    request_.body = std::move(parser_->get().body());
    serve();
  }

  void refuse_body() {
    reply(error_reply(413, "the body is over " + std::to_string(server_.options.max_body_bytes) +
                               " bytes (ControlEndpoint.max_body_bytes)"),
          /*close=*/true);
  }

  void serve() {
    HttpResponse response;
    try {
      response = server_.routes.serve(request_);
    } catch (const std::exception& error) {
      response = error_reply(500, error.what());
    }
    reply(response, /*close=*/!keep_alive_);
  }

  // A HEAD reply is the GET reply's head, its Content-Length included.
  void reply(const HttpResponse& response, bool close) {
    if (head_) {
      auto message = std::make_shared<http::response<http::empty_body>>();
      fill(*message, response, close);
      message->content_length(response.body.size());
      return send(std::move(message), close);
    }
    auto message = std::make_shared<http::response<http::string_body>>();
    fill(*message, response, close);
    message->body() = response.body;
    message->prepare_payload();
    send(std::move(message), close);
  }

  template <class Message>
  static void fill(Message& message, const HttpResponse& response, bool close) {
    message.version(11);
    message.result(static_cast<unsigned>(response.status));
    if (!response.body.empty()) message.set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) message.set(name, value);
    message.keep_alive(!close);
  }

  template <class Message>
  void send(std::shared_ptr<Message> message, bool close) {
    stream_.expires_after(server_.options.timeout);
    http::async_write(stream_, *message,
                      [self = shared_from_this(), message, close](beast::error_code ec, std::size_t) {
                        if (ec) return self->close();
                        if (close) return self->linger();
                        self->read_head();
                      });
  }

  // Half-closes, then reads and drops what the client still sends (the unread body) for a short while, so the reply
  // reaches it instead of a reset.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    stream_.expires_after(std::min<std::chrono::milliseconds>(server_.options.timeout, std::chrono::seconds(1)));
    drain();
  }
  void drain() {
    stream_.async_read_some(asio::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t) {
                              if (ec) return self->close();
                              self->drain();
                            });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpServer::Impl& server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest request_;
  std::string remote_addr_;
  bool keep_alive_ = false;
  bool head_ = false;
  char drain_buffer_[4096];
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    if (stopped.load() || !acceptor.is_open()) return;
    if (ec) {  // out of descriptors, say: try again shortly rather than spin
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec) accept();
      });
      return;
    }
    const bool over_limit = connections.load() >= options.max_connections;
    std::make_shared<Session>(std::move(socket), *this)->start(over_limit);
    accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, HttpRoutes routes)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(routes))) {
  Impl& impl = *impl_;
  const std::string where = impl.options.host + ":" + std::to_string(impl.options.port);
  beast::error_code ec;
  tcp::resolver resolver(impl.io);
  const auto addresses = resolver.resolve(impl.options.host, std::to_string(impl.options.port),
                                          tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) throw std::runtime_error("cannot resolve " + where + ": " + ec.message());
  std::string failure = "no address";
  for (const auto& address : addresses) {
    beast::error_code bind_ec;
    impl.acceptor.open(address.endpoint().protocol(), bind_ec);
    if (!bind_ec) impl.acceptor.set_option(asio::socket_base::reuse_address(true), bind_ec);
    if (!bind_ec) impl.acceptor.bind(address.endpoint(), bind_ec);
    if (!bind_ec) impl.acceptor.listen(asio::socket_base::max_listen_connections, bind_ec);
    if (!bind_ec) break;
    failure = bind_ec.message();
    beast::error_code ignored;
    impl.acceptor.close(ignored);
  }
  if (!impl.acceptor.is_open()) throw std::runtime_error("cannot listen on " + where + ": " + failure);
  impl.port = impl.acceptor.local_endpoint().port();
  impl.accept();
  const int threads = std::max(1, impl.options.threads);
  for (int i = 0; i < threads; ++i) impl.threads.emplace_back([&impl] { impl.io.run(); });
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const noexcept { return impl_->port; }

void HttpServer::stop() noexcept {
  if (impl_->stopped.exchange(true)) return;
  impl_->io.stop();  // the threads finish the handler they run and return; the sessions left die with io
  for (std::thread& thread : impl_->threads) thread.join();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

}  // namespace callbacks
}  // namespace bridge::training
