// ControlEndpoint: routes of an HttpServer (training/callbacks/http_server.h) on background threads; the training
// thread hands them snapshots and takes their commands, both under one mutex (a few map copies per log step, one
// uncontended lock per step otherwise).
#include "training/callbacks/control_endpoint.h"

#include <prometheus/check_names.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/config/config.h"
#include "utils/durable_file.h"
#include "utils/logging.h"
#include "utils/strings.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string trim(std::string_view text) { return std::string(bridge::utils::trim(text)); }

// Compares in time independent of where the strings differ, so the token cannot be guessed byte by byte.
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned char difference = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i) {
    difference |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  }
  return difference == 0;
}

// "lm loss" -> "bridge_lm_loss", "throughput/tokens_per_sec" -> "bridge_throughput_tokens_per_sec".
std::string prometheus_name(const std::string& metric) {
  std::string name = "bridge_";
  for (const char c : metric) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    name += ok ? c : '_';
  }
  return name;
}

HttpResponse json_reply(int status, const nlohmann::json& body) {
  HttpResponse response;
  response.status = status;
  response.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";  // paths may not be UTF-8
  return response;
}

// The paths served and the methods each takes (HEAD: GET's head); any other method on them is 405.
const std::map<std::string, std::vector<std::string>>& routes() {
  static const std::map<std::string, std::vector<std::string>> table = {{"/status", {"GET", "HEAD"}},
                                                                        {"/metrics", {"GET", "HEAD"}},
                                                                        {"/stop", {"POST"}},
                                                                        {"/save", {"POST"}},
                                                                        {"/abort", {"POST"}}};
  return table;
}

}  // namespace

ControlEndpoint::ControlEndpoint(ControlEndpointOptions options) : options_(std::move(options)) {
  if (options_.port < 0 || options_.port > 65535) {
    throw std::invalid_argument("ControlEndpoint.port is " + std::to_string(options_.port) +
                                "; use 1-65535, or 0 for a free port");
  }
  if (options_.max_body_bytes < 0) {
    throw std::invalid_argument("ControlEndpoint.max_body_bytes must be 0 or more");
  }
  if (!options_.token_file.empty()) {
    std::ifstream file(options_.token_file);
    std::stringstream text;
    text << file.rdbuf();
    if (!file) {
      throw std::invalid_argument("ControlEndpoint.token_file: cannot read '" + options_.token_file +
                                  "'; write the bearer token into it (chmod 600), or unset token_file");
    }
    token_ = trim(text.str());
    if (token_.empty()) {
      throw std::invalid_argument("ControlEndpoint.token_file: '" + options_.token_file + "' is empty");
    }
  } else if (!options_.token_env.empty()) {
    if (const char* value = std::getenv(options_.token_env.c_str())) token_ = trim(value);
  }
  if (token_.empty() && !is_loopback(options_.host)) {
    throw std::invalid_argument("ControlEndpoint.host is " + options_.host +
                                ": an address other than loopback needs a bearer token. Put one in a file and set "
                                "ControlEndpoint.token_file, or set the environment variable " +
                                (options_.token_env.empty() ? std::string("named by token_env") : options_.token_env) +
                                "; or bind 127.0.0.1");
  }
}

ControlEndpoint::~ControlEndpoint() { stop_server(); }

HttpResponse ControlEndpoint::status_reply() {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json body = {{"state", state_},
                         {"step", step_},
                         {"logged_step", logged_step_},
                         {"train_iters", train_iters_},
                         {"metrics", metrics_},
                         {"validation", validation_losses_},
                         {"layout", nlohmann::json::parse(layout_json_)},
                         {"pending", commands_.size()}};
  for (const auto& [key, name] : {std::pair<const char*, const char*>{"lm loss", "loss"},
                                  {"learning-rate", "lr"},
                                  {"throughput/tokens_per_sec", "tokens_per_sec"}}) {
    if (const auto it = metrics_.find(key); it != metrics_.end()) body[name] = it->second;
  }
  if (eta_seconds_) {
    // The log step's estimate, counted down since: what a user reads, and the seconds for scripts.
    const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - logged_at_).count();
    const double left = std::max(0.0, *eta_seconds_ - since);
    body["eta"] = bridge::utils::format_duration(left);
    body["eta_seconds"] = std::round(left * 10.0) / 10.0;
  }
  return json_reply(200, body);
}

HttpResponse ControlEndpoint::metrics_reply() {
  prometheus::Registry registry;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto gauge = [&registry](const std::string& metric, double value) {
      const std::string name = prometheus_name(metric);
      if (!prometheus::CheckMetricName(name)) return;
      prometheus::BuildGauge().Name(name).Help(metric).Register(registry).Add({}).Set(value);
    };
    gauge("step", static_cast<double>(step_));
    gauge("train_iters", static_cast<double>(train_iters_));
    for (const auto& [metric, value] : metrics_) gauge(metric, value);
    for (const auto& [metric, value] : validation_losses_) gauge(metric + " validation", value);
  }
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, registry.Collect());
  HttpResponse response;
  response.content_type = "text/plain; version=0.0.4";
  response.body = text.str();
  return response;
}

std::optional<HttpResponse> ControlEndpoint::screen(const HttpRequest& request) const {
  if (!token_.empty()) {
    const std::string header = request.header("Authorization");
    const std::string prefix = "Bearer ";
    if (header.rfind(prefix, 0) != 0 || !same_secret(header.substr(prefix.size()), token_)) {
      HttpResponse refused =
          json_reply(401, {{"error", "missing or wrong bearer token (Authorization: Bearer <token>)"}});
      refused.headers.emplace_back("WWW-Authenticate", "Bearer");
      return refused;
    }
  }
  const auto route = routes().find(request.path);
  if (route == routes().end()) {
    return json_reply(404, {{"error", "no " + request.path +
                                          "; the endpoints are GET /status, GET /metrics, POST /stop, POST /save, "
                                          "POST /abort"}});
  }
  const std::vector<std::string>& methods = route->second;
  if (std::find(methods.begin(), methods.end(), request.method) == methods.end()) {
    const std::string allowed = bridge::utils::join(methods, ", ");
    // A known path with the wrong method: 405 naming the right ones, rather than a 404 that hides the path.
    HttpResponse refused =
        json_reply(405, {{"error", request.method + " " + request.path + " is not served; use " + allowed}});
    refused.headers.emplace_back("Allow", allowed);
    return refused;
  }
  return std::nullopt;
}

HttpResponse ControlEndpoint::serve(const HttpRequest& request) {
  if (request.path == "/status") return status_reply();
  if (request.path == "/metrics") return metrics_reply();
  const std::string action = request.path.substr(1);  // screen() let only POST /stop, /save and /abort through
  const std::string reason = "POST /" + action + " from " + request.remote_addr +
                             (request.body.empty() ? std::string() : ": " + trim(request.body).substr(0, 200));
  std::lock_guard<std::mutex> lock(mutex_);
  if (action == "save" && !can_save_) {
    // Accepting it would only lead to "not saved" in the log after the step: say so now, with the fix.
    return json_reply(409, {{"error",
                             "checkpoint.save is not set: this run has no directory to save to, so there is "
                             "nothing to save into; start the run with checkpoint.save=<directory> to save "
                             "on request"}});
  }
  if (state_ != "training") {
    return json_reply(409, {{"error", "training is " + state_ + " (" + std::to_string(step_) +
                                          " steps done); nothing to " + action}});
  }
  commands_.push_back(Command{action, reason});
  // The next step's end takes it (on_train_step_end, under this mutex), and the loop acts after that step.
  return json_reply(202, {{"accepted", action}, {"after_step", step_ + 1}});
}

void ControlEndpoint::on_train_start(CallbackContext& ctx) {
  const bool distributed = parallel::is_distributed_initialized();
  if (!parallel::is_last_rank()) return;  // the last rank serves
  stop_server();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    step_ = logged_step_ = ctx.state.train_state.step;
    train_iters_ = ctx.state.cfg != nullptr ? ctx.state.cfg->train.train_iters : 0;
    nlohmann::json layout = {{"world_size", distributed ? parallel::get_world_size() : 1}};
    if (parallel::model_parallel_is_initialized()) {
      layout["tensor_model_parallel_size"] = parallel::get_tensor_model_parallel_world_size();
      layout["pipeline_model_parallel_size"] = parallel::get_pipeline_model_parallel_world_size();
      layout["data_parallel_size"] = parallel::get_data_parallel_world_size();
    }
    layout_json_ = layout.dump();
    state_ = "training";
    can_save_ = ctx.state.cfg == nullptr || !ctx.state.cfg->checkpoint.save.empty();
    eta_seconds_.reset();
    commands_.clear();
    metrics_.clear();
    validation_losses_.clear();
  }
  HttpServerOptions http;
  http.host = options_.host;
  http.port = options_.port;
  http.max_body_bytes = static_cast<std::uint64_t>(options_.max_body_bytes);
  try {
    server_ = std::make_unique<HttpServer>(std::move(http),
                                           HttpRoutes{[this](const HttpRequest& request) { return screen(request); },
                                                      [this](const HttpRequest& request) { return serve(request); }});
  } catch (const std::runtime_error& error) {
    throw std::runtime_error("ControlEndpoint: " + std::string(error.what()) +
                             " (in use, or not an address of this host); choose another ControlEndpoint.port, or 0 "
                             "for a free one");
  }
  const int bound = server_->port();
  port_.store(bound);
  const std::string url = "http://" + options_.host + ":" + std::to_string(bound);
  bridge::utils::log_info_on_this_rank("control endpoint: " + url + (token_.empty() ? "" : " (bearer token required)") +
                                       " (GET /status, /metrics; POST /stop, /save, /abort)");
  if (!options_.endpoint_file.empty()) bridge::utils::write_file_durably(options_.endpoint_file, url + "\n");
}

void ControlEndpoint::on_train_step_end(CallbackContext& ctx) {
  std::vector<Command> commands;
  {
    // The step count and the queue change together, so a POST's after_step is the step whose end takes it.
    std::lock_guard<std::mutex> lock(mutex_);
    step_ = ctx.iteration();  // the steps done once the loop counts this one, just after the event
    commands.swap(commands_);
    for (const Command& command : commands) {
      if (command.action != "save") state_ = "stopping";  // the loop stops after this step: later POSTs get 409
    }
    if (train_iters_ > 0 && step_ >= train_iters_ && state_ == "training") state_ = "finishing";  // no step to follow
  }
  for (const Command& command : commands) {
    if (command.action == "stop") ctx.request_stop(command.reason);
    if (command.action == "save") ctx.request_save(command.reason);
    if (command.action == "abort") ctx.request_abort(command.reason);
  }
}

void ControlEndpoint::on_log(CallbackContext& ctx) {
  if (!server_) return;
  const std::int64_t step = ctx.state.train_state.step;
  const auto take = [this, step](const LogRecord& record) {
    std::lock_guard<std::mutex> lock(mutex_);
    logged_step_ = step;
    metrics_ = record.metrics;
    eta_seconds_ = record.eta_seconds;
    logged_at_ = std::chrono::steady_clock::now();
  };
  take(*ctx.log);
  // Again once every on_log callback has run: SpeedMonitor's tokens/s and RuntimeEstimator's ETA, whatever the
  // order they were registered in.
  ctx.log->when_complete(take);
}

void ControlEndpoint::on_eval_end(CallbackContext& ctx) {
  if (!server_ || ctx.total_loss_dict->empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  validation_losses_.clear();
  for (const auto& [name, value] : *ctx.total_loss_dict) validation_losses_[name] = value.item<double>();
}

void ControlEndpoint::on_train_end(CallbackContext&) { stop_server(); }

void ControlEndpoint::on_exception(CallbackContext&) { stop_server(); }

void ControlEndpoint::stop_server() {
  if (!server_) return;
  std::vector<Command> dropped;
  std::int64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = "finished";
    dropped.swap(commands_);
    step = step_;
  }
  server_->stop();  // joins its threads; a handler running now finishes first
  server_.reset();
  port_.store(0);
  for (const Command& command : dropped) {
    // Accepted (202), but training ended by another cause before the step the reply named.
    bridge::utils::logger().warn("ControlEndpoint: training ended after step {} before it could act on {}", step,
                                 command.reason);
  }
}

}  // namespace callbacks
}  // namespace bridge::training
