// ControlEndpoint: HTTP control of a running job (Forgather's TrainerControl, made safe to expose).
//
//   manager->add(std::make_shared<ControlEndpoint>());   // or {type: ControlEndpoint, port: 8765} in a recipe
//
//   curl http://127.0.0.1:8765/status                    # JSON: step, losses, lr, tokens/s, ETA, layout
//   curl http://127.0.0.1:8765/metrics                   # the latest metrics in Prometheus' text format
//   curl -X POST http://127.0.0.1:8765/stop              # also /save and /abort, with an optional reason as body
//
// The server (HttpServer, on Boost.Beast) runs on background threads of the last rank (the one that holds the losses
// and prints the log) from on_train_start to on_train_end. A POST is queued and taken at the next step's end as the
// matching control request, which the loop agrees on across ranks, so every rank stops, saves or aborts after the
// same step: the one its 202 reply names as "after_step". It binds 127.0.0.1 by default; binding any other address
// needs a bearer token, read from `token_file` or the environment variable named by `token_env` (never from the
// config, never logged). When a token is set every request must carry "Authorization: Bearer <token>"; one that does
// not gets 401 and changes nothing. The bound address is logged and, with `endpoint_file`, written there (port 0
// picks a free port).
//
// /status reads the last log step's record once every on_log callback has run (LogRecord::when_complete), so the
// tokens/s of a SpeedMonitor and the ETA ("eta": "0:12:34", "eta_seconds") show whatever the registration order.
//
// Statuses: 202 accepted; 400 malformed (or HTTP/1.1 without Host); 401 no or wrong token; 404 unknown path; 405 a
// method the path does not serve (with Allow); 409 no step will take the POST (training not running, a stop already
// taken, or the last step done) or a /save without checkpoint.save; 413 a body over max_body_bytes, sized or chunked,
// refused while it is read; 431 a request line and header fields over 8 KiB. A POST without a body needs no
// Content-Length (curl -X POST).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "training/callbacks/callback.h"
#include "training/callbacks/http_server.h"

namespace bridge::training {
inline namespace callbacks {

struct ControlEndpointOptions {
  std::string host = "127.0.0.1";                  ///< the address to bind; other than loopback needs a token
  int port = 0;                                    ///< 0: a free port (logged, and written to endpoint_file)
  std::string endpoint_file;                       ///< where to write "http://<host>:<port>" once bound; empty: nowhere
  std::string token_file;                          ///< a file holding the bearer token
  std::string token_env = "BRIDGE_CONTROL_TOKEN";  ///< or the environment variable holding it
  std::int64_t max_body_bytes = 4096;              ///< larger bodies get 413, whether sized or chunked
};

class ControlEndpoint : public Callback {
 public:
  /// Reads the token; throws std::invalid_argument naming the option when the options cannot be served (another
  /// address than loopback without a token, an unreadable token file, a port outside 0-65535).
  explicit ControlEndpoint(ControlEndpointOptions options = {});
  ~ControlEndpoint() override;
  ControlEndpoint(const ControlEndpoint&) = delete;
  ControlEndpoint& operator=(const ControlEndpoint&) = delete;

  void on_train_start(CallbackContext& ctx) override;
  void on_train_step_end(CallbackContext& ctx) override;
  void on_log(CallbackContext& ctx) override;
  void on_eval_end(CallbackContext& ctx) override;
  void on_train_end(CallbackContext& ctx) override;
  void on_exception(CallbackContext& ctx) override;

  /// The port the server listens on; 0 when it is not running (or not on this rank).
  int port() const noexcept { return port_.load(); }
  /// Whether a token is required.
  bool requires_token() const noexcept { return !token_.empty(); }

 private:
  struct Command {
    std::string action;  // "stop", "save" or "abort"
    std::string reason;
  };
  void stop_server();
  // On the server's threads: refuses on the head alone (401, 404, 405), then serves the request.
  std::optional<HttpResponse> screen(const HttpRequest& request) const;
  HttpResponse serve(const HttpRequest& request);
  HttpResponse status_reply();
  HttpResponse metrics_reply();

  ControlEndpointOptions options_;
  std::string token_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<int> port_{0};

  // Shared with the server's threads, under mutex_.
  std::mutex mutex_;
  std::vector<Command> commands_;
  std::int64_t step_ = 0;  // steps done: set at every step's end, with commands_ taken at the same time
  std::int64_t logged_step_ = 0, train_iters_ = 0;
  std::map<std::string, double> metrics_;  // the last log step's record (of step logged_step_)
  std::optional<double> eta_seconds_;      // its estimate of the time left, made at logged_at_
  std::chrono::steady_clock::time_point logged_at_;
  bool can_save_ = true;                             // checkpoint.save is set: a POST /save can be acted on
  std::map<std::string, double> validation_losses_;  // the last evaluation's
  std::string layout_json_;
  std::string state_ = "starting";  // training, stopping (a stop or abort taken), finishing (the last step done), ...
};

}  // namespace callbacks
}  // namespace bridge::training
