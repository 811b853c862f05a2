// ControlEndpoint: a cpp-httplib server on its own thread; the training thread hands it snapshots and takes its
// commands, both under one mutex (a few map copies per log step, one flag read per step otherwise).
#include "training/callbacks/control_endpoint.h"

#include <httplib.h>
#include <prometheus/check_names.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/config.h"
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

void reply_json(httplib::Response& response, int status, const nlohmann::json& body) {
  response.status = status;
  response.set_content(body.dump() + "\n", "application/json");
}

}  // namespace

struct ControlEndpoint::Server {
  httplib::Server http;
  std::atomic<bool> listen_returned{false};
};

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
    commands_.clear();
    metrics_.clear();
    validation_losses_.clear();
  }
  server_ = std::make_unique<Server>();
  httplib::Server& http = server_->http;
  http.set_payload_max_length(static_cast<std::size_t>(options_.max_body_bytes));
  http.set_read_timeout(5, 0);
  http.set_write_timeout(5, 0);
  http.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (token_.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string header = request.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (header.rfind(prefix, 0) == 0 && same_secret(header.substr(prefix.size()), token_)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    response.set_header("WWW-Authenticate", "Bearer");
    reply_json(response, 401, {{"error", "missing or wrong bearer token (Authorization: Bearer <token>)"}});
    return httplib::Server::HandlerResponse::Handled;
  });

  http.Get("/status", [this](const httplib::Request&, httplib::Response& response) {
    std::lock_guard<std::mutex> lock(mutex_);
    nlohmann::json body = {{"state", state_},
                           {"step", step_.load()},
                           {"logged_step", logged_step_},
                           {"train_iters", train_iters_},
                           {"metrics", metrics_},
                           {"validation", validation_losses_},
                           {"layout", nlohmann::json::parse(layout_json_)},
                           {"pending", commands_.size()}};
    for (const auto& [key, name] : {std::pair<const char*, const char*>{"lm loss", "loss"},
                                    {"learning-rate", "lr"},
                                    {"throughput/tokens_per_sec", "tokens_per_sec"},
                                    {"time/remaining_estimate", "remaining_estimate"}}) {
      if (const auto it = metrics_.find(key); it != metrics_.end()) body[name] = it->second;
    }
    reply_json(response, 200, body);
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    prometheus::Registry registry;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto gauge = [&registry](const std::string& metric, double value) {
        const std::string name = prometheus_name(metric);
        if (!prometheus::CheckMetricName(name)) return;
        prometheus::BuildGauge().Name(name).Help(metric).Register(registry).Add({}).Set(value);
      };
      gauge("step", static_cast<double>(step_.load()));
      gauge("train_iters", static_cast<double>(train_iters_));
      for (const auto& [metric, value] : metrics_) gauge(metric, value);
      for (const auto& [metric, value] : validation_losses_) gauge(metric + " validation", value);
    }
    std::ostringstream text;
    prometheus::TextSerializer().Serialize(text, registry.Collect());
    response.set_content(text.str(), "text/plain; version=0.0.4");
  });
  for (const char* action : {"stop", "save", "abort"}) {
    http.Post(std::string("/") + action, [this, action](const httplib::Request& request, httplib::Response& response) {
      const std::string reason = "POST /" + std::string(action) + " from " + request.remote_addr +
                                 (request.body.empty() ? std::string() : ": " + trim(request.body).substr(0, 200));
      std::int64_t step = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (state_ != "training") {
          reply_json(response, 409, {{"error", "training is " + state_ + "; nothing to " + action}});
          return;
        }
        commands_.push_back(Command{action, reason});
        has_commands_.store(true);
        step = step_.load();
      }
      reply_json(response, 202, {{"accepted", action}, {"after_step", step}});
    });
  }
  // A known path with the wrong method: 405 naming the right one, rather than a 404 that hides the path.
  const auto wrong_method = [](const char* allowed) {
    return [allowed](const httplib::Request& request, httplib::Response& response) {
      response.set_header("Allow", allowed);
      reply_json(response, 405, {{"error", request.method + " " + request.path + " is not served; use " + allowed}});
    };
  };
  for (const char* path : {"/status", "/metrics"}) {
    http.Post(path, wrong_method("GET"));
    http.Put(path, wrong_method("GET"));
    http.Delete(path, wrong_method("GET"));
  }
  for (const char* path : {"/stop", "/save", "/abort"}) {
    http.Get(path, wrong_method("POST"));
    http.Put(path, wrong_method("POST"));
    http.Delete(path, wrong_method("POST"));
  }
  http.set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (response.status == 404) {
      reply_json(response, 404,
                 {{"error", "no " + request.path +
                                "; the endpoints are GET /status, GET /metrics, POST /stop, "
                                "POST /save, POST /abort"}});
    }
  });

  const int bound = options_.port == 0 ? http.bind_to_any_port(options_.host)
                                       : (http.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (bound <= 0) {
    server_.reset();
    throw std::runtime_error("ControlEndpoint: cannot listen on " + options_.host + ":" +
                             std::to_string(options_.port) +
                             " (in use, or not an address of this host); choose another ControlEndpoint.port, or 0 "
                             "for a free one");
  }
  port_.store(bound);
  thread_ = std::thread([server = server_.get()] {
    server->http.listen_after_bind();
    server->listen_returned.store(true);
  });
  // cpp-httplib's stop() does nothing until the accept loop has marked the server running, so a training that ended
  // at once would leave the loop, and stop_server()'s join, waiting forever (CI hung so). Debian's cpp-httplib has no
  // wait_until_ready().
  while (!server_->http.is_running() && !server_->listen_returned.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->http.is_running()) {
    stop_server();
    throw std::runtime_error("ControlEndpoint: the server on " + options_.host + ":" + std::to_string(bound) +
                             " stopped before it served; see the log above, or choose another ControlEndpoint.port");
  }
  const std::string url = "http://" + options_.host + ":" + std::to_string(bound);
  bridge::utils::log_info_on_this_rank("control endpoint: " + url + (token_.empty() ? "" : " (bearer token required)") +
                                       " (GET /status, /metrics; POST /stop, /save, /abort)");
  if (!options_.endpoint_file.empty()) bridge::utils::write_file_durably(options_.endpoint_file, url + "\n");
}

void ControlEndpoint::on_train_step_end(CallbackContext& ctx) {
  step_.store(ctx.state.train_state.step + 1, std::memory_order_relaxed);  // the loop counts the step after this event
  if (!has_commands_.load(std::memory_order_relaxed)) return;
  std::vector<Command> commands;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    commands.swap(commands_);
    has_commands_.store(false);
  }
  for (const Command& command : commands) {
    if (command.action == "stop") ctx.request_stop(command.reason);
    if (command.action == "save") ctx.request_save(command.reason);
    if (command.action == "abort") ctx.request_abort(command.reason);
  }
}

void ControlEndpoint::on_log(CallbackContext& ctx) {
  if (!server_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  logged_step_ = ctx.state.train_state.step;
  metrics_ = ctx.log->metrics;
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = "finished";
  }
  server_->http.stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
  port_.store(0);
}

}  // namespace callbacks
}  // namespace bridge::training
