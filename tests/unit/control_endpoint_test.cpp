// ControlEndpoint against real HTTP clients over loopback (cpp-httplib's and the curl binary): status and Prometheus
// metrics from the last log step (with what callbacks registered after the endpoint add, and the ETA as a duration),
// POSTs that become control requests at the next step's end, the step a 202 names against a real pretrain() run,
// 409 when no step would take a POST or a save has no checkpoint.save, bearer-token auth (401 changes nothing), wrong
// methods, unknown paths, oversized requests, many concurrent clients, and the server gone when training ends. The
// wire-level cases (raw sockets) are in control_endpoint_http_test.cpp. Across ranks, a stop sent to a running job
// ends every rank at the same step: gpt_dist_test's GptBuiltins.
#include "training/callbacks/control_endpoint.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bridge/bridge.h"
#include "tests/unit/control_endpoint_test_support.h"
#include "training/callbacks/callback_manager.h"
#include "training/config/config.h"

namespace bridge::training {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using namespace std::chrono_literals;
using testing::ControlEndpointTest;

TEST_F(ControlEndpointTest, StatusAndMetricsShowTheLastLogStep) {
  start();
  state_.train_state.step = 7;
  log({{"lm loss", 3.5}, {"learning-rate", 1e-4}, {"throughput/tokens_per_sec", 1234.0}});
  fire(Event::kEvalEnd, [](CallbackContext& ctx) {
    ctx.total_loss_dict = LossDict{{"lm loss", torch::tensor(3.25, torch::kDouble)}};
  });
  fire(Event::kTrainStepEnd, [](CallbackContext&) {});  // step 8 ends; no log step
  state_.train_state.step = 8;
  const auto status = client_->Get("/status");
  ASSERT_TRUE(status) << httplib::to_string(status.error());
  EXPECT_EQ(status->status, 200);
  EXPECT_EQ(status->get_header_value("Content-Type"), "application/json");
  const nlohmann::json body = nlohmann::json::parse(status->body);
  EXPECT_EQ(body["state"], "training");
  EXPECT_EQ(body["step"], 8) << "the steps done";
  EXPECT_EQ(body["logged_step"], 7) << "the step the metrics are from";
  EXPECT_EQ(body["train_iters"], 100);
  EXPECT_EQ(body["loss"], 3.5);
  EXPECT_EQ(body["lr"], 1e-4);
  EXPECT_EQ(body["tokens_per_sec"], 1234.0);
  EXPECT_EQ(body["validation"]["lm loss"], 3.25);
  EXPECT_EQ(body["layout"]["world_size"], 1);

  const auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE bridge_lm_loss gauge\nbridge_lm_loss 3.5\n"));
  EXPECT_THAT(metrics->body, HasSubstr("bridge_throughput_tokens_per_sec 1234\n"));
  EXPECT_THAT(metrics->body, HasSubstr("bridge_lm_loss_validation 3.25\n"));
  EXPECT_THAT(metrics->body, HasSubstr("bridge_step 8\n"));
}

// Callbacks registered after the endpoint add to the record after its on_log: /status reads the record once all of
// them have run, so a SpeedMonitor's tokens/s and a RuntimeEstimator's ETA show whatever the order; the ETA reads as
// a duration, with its seconds for scripts.
TEST_F(ControlEndpointTest, StatusShowsWhatLaterCallbacksAddAndTheEtaAsADuration) {
  start();
  manager_.register_callback(Event::kLog, [](CallbackContext& ctx) {
    ctx.log->metrics["throughput/tokens_per_sec"] = 1234.0;
    ctx.log->eta_seconds = 3723.4;  // as RuntimeEstimator replaces the loop's estimate
  });
  state_.train_state.step = 5;
  log({{"lm loss", 3.5}}, 10.0);
  const auto status = client_->Get("/status");
  ASSERT_TRUE(status) << httplib::to_string(status.error());
  const nlohmann::json body = nlohmann::json::parse(status->body);
  EXPECT_EQ(body["tokens_per_sec"], 1234.0);
  EXPECT_EQ(body["eta"], "1:02:03");
  EXPECT_NEAR(body["eta_seconds"].get<double>(), 3723.4, 1.0);
  EXPECT_FALSE(body.contains("remaining_estimate")) << "no bare number in an unnamed unit";
  EXPECT_THAT(client_->Get("/metrics")->body, HasSubstr("bridge_throughput_tokens_per_sec 1234\n"));
}

// A save needs checkpoint.save: without it the POST is refused at once, naming the key, not accepted and then
// "not saved" in the log. A stop needs no directory.
TEST_F(ControlEndpointTest, ASaveWithoutCheckpointSaveGets409NamingTheKey) {
  keep_save_unset_ = true;
  start();
  const auto save = client_->Post("/save", "", "text/plain");
  ASSERT_TRUE(save);
  EXPECT_EQ(save->status, 409);
  EXPECT_THAT(save->body, HasSubstr("checkpoint.save is not set"));
  EXPECT_THAT(save->body, HasSubstr("checkpoint.save=<directory>"));
  EXPECT_THAT(step_end(), IsEmpty());
  EXPECT_EQ(client_->Post("/stop", "", "text/plain")->status, 202);
}

TEST_F(ControlEndpointTest, PostsBecomeControlRequestsAtTheNextStepEnd) {
  start();
  const auto save = client_->Post("/save", "before the learning-rate drop", "text/plain");
  ASSERT_TRUE(save);
  EXPECT_EQ(save->status, 202);
  EXPECT_EQ(nlohmann::json::parse(save->body)["accepted"], "save");
  const std::vector<ControlRequest> saves = step_end();
  ASSERT_THAT(saves, SizeIs(1));
  EXPECT_EQ(saves[0].action, ControlAction::kSave);
  EXPECT_EQ(saves[0].callback, "ControlEndpoint");
  EXPECT_EQ(saves[0].event, Event::kTrainStepEnd);
  EXPECT_EQ(saves[0].reason, "POST /save from 127.0.0.1: before the learning-rate drop");
  EXPECT_THAT(step_end(), IsEmpty());  // taken once
  const auto stop = client_->Post("/stop", "", "text/plain");
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->status, 202);
  EXPECT_EQ(nlohmann::json::parse(stop->body)["accepted"], "stop");
  ASSERT_EQ(client_->Post("/abort", "", "text/plain")->status, 202);
  const std::vector<ControlRequest> requests = step_end();
  ASSERT_THAT(requests, SizeIs(2));  // in the order they came
  EXPECT_EQ(requests[0].action, ControlAction::kStop);
  EXPECT_EQ(requests[0].reason, "POST /stop from 127.0.0.1");
  EXPECT_EQ(requests[1].action, ControlAction::kAbort);
}

TEST_F(ControlEndpointTest, WithATokenEveryRequestWithoutItGets401AndChangesNothing) {
  ASSERT_EQ(::setenv("BRIDGE_TEST_CONTROL_TOKEN", "s3cret-token", 1), 0);
  ControlEndpointOptions options;
  options.token_env = "BRIDGE_TEST_CONTROL_TOKEN";
  start(options);
  ::unsetenv("BRIDGE_TEST_CONTROL_TOKEN");
  EXPECT_TRUE(endpoint_->requires_token());
  for (const char* header : {"", "Bearer wrong", "Bearer s3cret-toke", "Bearer s3cret-token2", "s3cret-token"}) {
    httplib::Headers headers;
    if (*header != '\0') headers.emplace("Authorization", header);
    const auto stop = client_->Post("/stop", headers, "", "text/plain");
    ASSERT_TRUE(stop);
    EXPECT_EQ(stop->status, 401) << header;
    EXPECT_EQ(stop->get_header_value("WWW-Authenticate"), "Bearer");
    EXPECT_EQ(client_->Get("/status", headers)->status, 401) << header;
    EXPECT_EQ(client_->Get("/metrics", headers)->status, 401) << header;
  }
  EXPECT_THAT(step_end(), IsEmpty());
  const httplib::Headers good = {{"Authorization", "Bearer s3cret-token"}};
  EXPECT_EQ(client_->Get("/status", good)->status, 200);
  EXPECT_EQ(client_->Post("/stop", good, "", "text/plain")->status, 202);
  EXPECT_THAT(step_end(), SizeIs(1));
}

TEST(ControlEndpointOptions, AnotherAddressThanLoopbackNeedsAToken) {
  ControlEndpointOptions options;
  options.host = "0.0.0.0";
  options.token_env = "BRIDGE_TEST_UNSET_TOKEN";
  try {
    ControlEndpoint endpoint(options);
    ADD_FAILURE() << "bound 0.0.0.0 without a token";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("ControlEndpoint.host is 0.0.0.0: an address other than loopback needs a "
                                        "bearer token"));
    EXPECT_THAT(error.what(), HasSubstr("BRIDGE_TEST_UNSET_TOKEN"));
  }
  const std::filesystem::path token = std::filesystem::temp_directory_path() / "bridge_control_token_test";
  std::ofstream(token) << "from-a-file\n";
  options.token_file = token.string();
  const ControlEndpoint endpoint(options);
  EXPECT_TRUE(endpoint.requires_token());
  std::ofstream(token) << "";
  EXPECT_THROW(ControlEndpoint{options}, std::invalid_argument);  // an empty token file
  std::filesystem::remove(token);
  EXPECT_THROW(ControlEndpoint{options}, std::invalid_argument);  // a missing one
  options = {};
  options.port = 70000;
  EXPECT_THROW(ControlEndpoint{options}, std::invalid_argument);
}

TEST_F(ControlEndpointTest, WrongMethodsUnknownPathsOversizedAndMalformedRequests) {
  ControlEndpointOptions options;
  options.max_body_bytes = 16;
  start(options);
  const auto get_stop = client_->Get("/stop");
  ASSERT_TRUE(get_stop);
  EXPECT_EQ(get_stop->status, 405);
  EXPECT_EQ(get_stop->get_header_value("Allow"), "POST");
  EXPECT_EQ(client_->Post("/status", "", "text/plain")->status, 405);
  EXPECT_EQ(client_->Delete("/metrics")->status, 405);
  const auto unknown = client_->Get("/shutdown");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_THAT(unknown->body, HasSubstr("the endpoints are GET /status"));
  const auto big = client_->Post("/stop", std::string(1000, 'x'), "text/plain");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);

  // Not HTTP at all, on a raw socket: a 400, and the server keeps serving.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(endpoint_->port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const std::string garbage = "\x01\x02 NOT-HTTP \xff\r\n\r\n";
  ASSERT_EQ(::send(fd, garbage.data(), garbage.size(), 0), static_cast<ssize_t>(garbage.size()));
  char reply[256] = {};
  const ssize_t got = ::recv(fd, reply, sizeof(reply) - 1, 0);
  ::close(fd);
  ASSERT_GT(got, 0);
  EXPECT_THAT(std::string(reply, static_cast<std::size_t>(got)), HasSubstr("400"));
  EXPECT_THAT(step_end(), IsEmpty());  // none of it queued anything
  EXPECT_EQ(client_->Get("/status")->status, 200);
}

TEST_F(ControlEndpointTest, ManyConcurrentClientsWhileTrainingLogs) {
  start();
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    for (int step = 0; !done.load(); ++step) {
      state_.train_state.step = step;
      log({{"lm loss", 1.0 + step}});
    }
  });
  std::atomic<int> ok{0}, posted{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", endpoint_->port());
      for (int i = 0; i < 20; ++i) {
        const auto status = client.Get(c % 4 == 0 ? "/metrics" : "/status");
        if (status && status->status == 200) ++ok;
      }
      if (c % 8 == 0) {
        const auto save = client.Post("/save", "", "text/plain");
        if (save && save->status == 202) ++posted;
      }
    });
  }
  for (std::thread& client : clients) client.join();
  done = true;
  trainer.join();
  EXPECT_EQ(ok.load(), 16 * 20);
  EXPECT_EQ(posted.load(), 2);
  EXPECT_THAT(step_end(), SizeIs(2));
}

TEST_F(ControlEndpointTest, TheServerEndsWithTrainingAndTheEndpointFileNamesIt) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "bridge_endpoint_test.url";
  ControlEndpointOptions options;
  options.endpoint_file = file.string();
  start(options);
  std::ifstream written(file);
  std::string url;
  std::getline(written, url);
  EXPECT_EQ(url, "http://127.0.0.1:" + std::to_string(endpoint_->port()));
  const int port = endpoint_->port();
  fire(Event::kTrainEnd);
  EXPECT_EQ(endpoint_->port(), 0);
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(1);
  EXPECT_FALSE(after.Get("/status"));  // nothing listens any more
  std::filesystem::remove(file);
}

// The same with the real curl, as the README tells users to run it.
TEST_F(ControlEndpointTest, TheRealCurlSavesAtOnce) {
  if (std::system("command -v curl >/dev/null 2>&1") != 0) GTEST_SKIP() << "no curl here (scripts/install_deps.sh)";
  start();
  const std::string command =
      "curl -sS -m 4 -X POST -w ' %{http_code}' http://127.0.0.1:" + std::to_string(endpoint_->port()) + "/save";
  const auto started = std::chrono::steady_clock::now();
  std::FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  ASSERT_EQ(::pclose(pipe), 0) << output;
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  EXPECT_THAT(output, HasSubstr("\"accepted\":\"save\",\"after_step\":1}\n 202"));
  const std::vector<ControlRequest> requests = step_end();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].action, ControlAction::kSave);
}

// Posts from inside a real run: one while step 3 runs (at its start) and one just after step 6's end (this callback
// comes after the endpoint); each 202's after_step must be the step the save or the stop then follows.
class PostDuringTheRun : public Callback {
 public:
  explicit PostDuringTheRun(std::shared_ptr<ControlEndpoint> endpoint) : endpoint_(std::move(endpoint)) {}
  void on_train_step_start(CallbackContext& ctx) override {
    if (ctx.state.train_state.step == 2) save_after = post("/save");
  }
  void on_train_step_end(CallbackContext& ctx) override {
    if (ctx.state.train_state.step == 5) stop_after = post("/stop");
  }
  void on_checkpoint_save(CallbackContext& ctx) override { saved_at.push_back(ctx.state.train_state.step); }

  int64_t save_after = -1, stop_after = -1;
  std::vector<int64_t> saved_at;

 private:
  int64_t post(const std::string& path) {
    httplib::Client client("127.0.0.1", endpoint_->port());
    const auto reply = client.Post(path, "", "text/plain");
    if (!reply || reply->status != 202) return -1;
    return nlohmann::json::parse(reply->body)["after_step"].get<int64_t>();
  }
  std::shared_ptr<ControlEndpoint> endpoint_;
};

TEST(ControlEndpointRun, TheStepA202NamesIsTheStepTheActionFollows) {
  const std::filesystem::path save =
      std::filesystem::temp_directory_path() / ("bridge_endpoint_run_" + std::to_string(::getpid()));
  std::filesystem::remove_all(save);
  ConfigContainer config;
  config.model.num_layers = 1;
  config.model.hidden_size = 16;
  config.model.num_attention_heads = 2;
  config.model.vocab_size = 64;
  config.model.seq_length = 8;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 2;
  config.train.num_threads = 1;
  config.train.train_iters = 50;
  config.checkpoint.save = save.string();
  auto endpoint = std::make_shared<ControlEndpoint>();
  auto poster = std::make_shared<PostDuringTheRun>(endpoint);
  auto manager = std::make_shared<CallbackManager>();
  manager->add({endpoint, poster});
  const TrainState state = pretrain(config, gpt_forward_step, manager);
  EXPECT_EQ(poster->save_after, 3);
  EXPECT_EQ(poster->stop_after, 7);
  EXPECT_EQ(state.step, poster->stop_after) << "the run stopped after another step than the reply named";
  ASSERT_FALSE(poster->saved_at.empty());
  EXPECT_EQ(poster->saved_at.front(), poster->save_after) << "saved after another step than the reply named";
  std::filesystem::remove_all(save);
}

// The same in a real run, with the real SpeedMonitor and RuntimeEstimator listed after the endpoint: a status read
// after the log step of step 5 has both.
class StatusReader : public Callback {
 public:
  explicit StatusReader(std::shared_ptr<ControlEndpoint> endpoint) : endpoint_(std::move(endpoint)) {}
  void on_train_step_end(CallbackContext& ctx) override {
    if (ctx.iteration() != 7) return;
    httplib::Client client("127.0.0.1", endpoint_->port());
    const auto reply = client.Get("/status");
    if (reply && reply->status == 200) body = nlohmann::json::parse(reply->body);
  }
  nlohmann::json body;

 private:
  std::shared_ptr<ControlEndpoint> endpoint_;
};

TEST(ControlEndpointRun, StatusHasTokensPerSecondAndTheEtaWithTheMonitorsListedAfterIt) {
  ConfigContainer config;
  config.model.num_layers = 1;
  config.model.hidden_size = 16;
  config.model.num_attention_heads = 2;
  config.model.vocab_size = 64;
  config.model.seq_length = 8;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 2;
  config.train.num_threads = 1;
  config.train.train_iters = 10;
  config.logging.log_interval = 5;
  auto endpoint = std::make_shared<ControlEndpoint>();
  auto reader = std::make_shared<StatusReader>(endpoint);
  auto manager = std::make_shared<CallbackManager>();
  manager->add({endpoint, std::make_shared<SpeedMonitor>(), std::make_shared<RuntimeEstimator>(), reader});
  pretrain(config, gpt_forward_step, manager);
  const nlohmann::json& body = reader->body;
  ASSERT_TRUE(body.is_object()) << "no status read at step 7";
  EXPECT_EQ(body["logged_step"], 5);
  ASSERT_TRUE(body.contains("tokens_per_sec")) << body.dump();
  EXPECT_GT(body["tokens_per_sec"].get<double>(), 0.0);
  ASSERT_TRUE(body.contains("eta")) << body.dump();
  EXPECT_THAT(body["eta"].get<std::string>(), ::testing::MatchesRegex("[0-9]+:[0-5][0-9]:[0-5][0-9]"));
  EXPECT_GE(body["eta_seconds"].get<double>(), 0.0);
}

// Once a stop is taken, or the last step is done, no later step will take a POST: 409 rather than a 202 naming a
// step that never comes.
TEST_F(ControlEndpointTest, PostsThatNoStepWouldTakeGet409) {
  start();
  ASSERT_EQ(client_->Post("/stop", "", "text/plain")->status, 202);
  ASSERT_THAT(step_end(), SizeIs(1));
  const auto late = client_->Post("/save", "", "text/plain");
  ASSERT_TRUE(late);
  EXPECT_EQ(late->status, 409);
  EXPECT_THAT(late->body, HasSubstr("training is stopping (1 steps done)"));
  fire(Event::kTrainEnd);

  config_.train.train_iters = 2;
  state_.train_state.step = 0;
  fire(Event::kTrainStart);
  client_ = std::make_unique<httplib::Client>("127.0.0.1", endpoint_->port());
  EXPECT_THAT(step_end(), IsEmpty());
  EXPECT_EQ(client_->Post("/save", "", "text/plain")->status, 202);  // after step 2, the last
  EXPECT_THAT(step_end(), SizeIs(1));
  const auto after_the_last = client_->Post("/stop", "", "text/plain");
  ASSERT_TRUE(after_the_last);
  EXPECT_EQ(after_the_last->status, 409);
  EXPECT_THAT(after_the_last->body, HasSubstr("training is finishing (2 steps done)"));
}

// A port in use is an error naming the address and the fix, not a server that never answers.
TEST_F(ControlEndpointTest, APortInUseIsAClearError) {
  start();
  ControlEndpointOptions options;
  options.port = endpoint_->port();
  ControlEndpoint second(options);
  CallbackContext ctx(state_, model_, manager_.user_state());
  try {
    second.on_train_start(ctx);
    ADD_FAILURE() << "two servers on port " << options.port;
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(options.port)));
    EXPECT_THAT(error.what(), HasSubstr("choose another ControlEndpoint.port"));
  }
  EXPECT_EQ(second.port(), 0);
  EXPECT_EQ(client_->Get("/status")->status, 200);  // the first serves on
}

// A run that ends right after it starts: the server's threads may not have run yet when it is stopped, and the join in
// on_train_end must not hang (with cpp-httplib, whose stop() did nothing until its accept loop ran, it did once in
// CI). Many cycles make the window likely.
TEST_F(ControlEndpointTest, AServerStoppedAsSoonAsItStartsEnds) {
  endpoint_ = std::make_shared<ControlEndpoint>(ControlEndpointOptions{});
  manager_.add(endpoint_);
  for (int cycle = 0; cycle < 300; ++cycle) {
    fire(Event::kTrainStart);
    ASSERT_GT(endpoint_->port(), 0) << "cycle " << cycle;
    fire(Event::kTrainEnd);
    ASSERT_EQ(endpoint_->port(), 0) << "cycle " << cycle;
  }
}

}  // namespace
}  // namespace bridge::training
