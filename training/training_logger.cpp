// TrainingLogger: the per-step accumulation, the one collective of a log step, on_log, the console line and the
// metric writers.
#include "training/training_logger.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "parallel/device.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "training/pretrain_setup.h"
#include "training/utils/flop_utils.h"
#include "training/utils/packed_statistics.h"
#include "training/utils/train_utils.h"
#include "utils/exception_message.h"
#include "utils/fanout_writer.h"
#include "utils/jsonl_writer.h"
#include "utils/logging.h"
#include "utils/tensorboard_writer.h"

namespace bridge::training {
namespace {

using parallel::ReduceOp;
using Entry = utils::PackedStatistics::Entry;

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string format_memory(const utils::StatReport& report) {
  std::string text;
  for (const auto& [name, value] : report) text += " | " + name + ": " + std::to_string(utils::to_double(value));
  return text;
}

}  // namespace

TrainingLogger::TrainingLogger(PretrainSetup& setup) : setup_(setup) {
  const LoggingConfig& logging = setup.config.logging;
  writer_rank_ = parallel::is_last_rank();
  flops_per_step_ = utils::num_floating_point_operations(setup.config.model, setup.config.train.global_batch_size,
                                                         setup.config.parallelism.tensor_model_parallel_size);
  // Writers live on the last rank; if they cannot be opened there, every rank must fail, not wait for it.
  std::string error;
  if (writer_rank_) {
    try {
      if (!logging.tensorboard_dir.empty()) {
        tensorboard_ = std::make_shared<bridge::utils::TensorBoardWriter>(logging.tensorboard_dir);
      }
      std::vector<std::shared_ptr<bridge::utils::MetricWriter>> others;
      if (!logging.jsonl_path.empty())
        others.push_back(std::make_shared<bridge::utils::JsonlWriter>(logging.jsonl_path));
      writer_ = bridge::utils::build_metric_writer(tensorboard_, others);
    } catch (const std::exception& e) {
      error = bridge::utils::describe(e);
    }
  }
  torch::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kDouble);
  parallel::get_world_group().all_reduce(failed, ReduceOp::kMax);
  if (failed.item<double>() > 0.0) {
    throw std::runtime_error(error.empty() ? "the last rank could not open the metric writers (see its error)"
                                           : "cannot open the metric writers (logging.tensorboard_dir / "
                                             "logging.jsonl_path): " +
                                                 error);
  }
}

void TrainingLogger::start() {
  parallel::synchronize_device(setup_.device);  // queued CUDA work belongs to the time before the start
  start_ = interval_start_ = std::chrono::steady_clock::now();
  start_wall_ = wall_seconds();
  flops_at_last_log_ = setup_.state.train_state.floating_point_operations_so_far;
  loaded_iteration_ = setup_.state.train_state.step;
}

double TrainingLogger::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

bool TrainingLogger::is_console_step(int64_t iteration) const {
  // Also the first step of the run, so that it shows its progress (and an ETA) at once, not after log_interval steps.
  return iteration % setup_.config.logging.log_interval == 0 || iteration == loaded_iteration_ + 1;
}

std::optional<double> TrainingLogger::eta_seconds(int64_t iteration, double now) const {
  const int64_t train_iters = setup_.config.train.train_iters;
  if (train_iters <= 0) return std::nullopt;
  // The mean step after the first (which carries the start-up) times the steps left; evaluations so far count in
  // the steps they followed, as the ones to come will.
  const int64_t timed = iteration - loaded_iteration_ - 1;
  const double per_step = timed > 0 ? (now - first_step_seconds_) / static_cast<double>(timed) : now;
  return per_step * static_cast<double>(std::max<int64_t>(0, train_iters - iteration));
}

bool TrainingLogger::is_writer_step(int64_t iteration) const {
  const LoggingConfig& logging = setup_.config.logging;
  const bool any_writer = !logging.tensorboard_dir.empty() || !logging.jsonl_path.empty();
  return any_writer && iteration % logging.tensorboard_log_interval == 0;
}

std::optional<LoggedStep> TrainingLogger::after_step(const LossDict& loss_dict, double grad_norm, bool skipped_iter) {
  const ConfigContainer& config = setup_.config;
  const LoggingConfig& logging = config.logging;
  TrainState& train_state = setup_.state.train_state;
  const int64_t iteration = train_state.step;
  utils::accumulate_losses(total_loss_dict_, loss_dict, skipped_iter);
  train_state.floating_point_operations_so_far += flops_per_step_;
  const double step_end = seconds_since_start();
  if (iteration == loaded_iteration_ + 1) first_step_seconds_ = step_end;
  history_wct_.push_back(step_end);
  while (static_cast<int64_t>(history_wct_.size()) > logging.throughput_window_size) history_wct_.pop_front();

  const bool console = is_console_step(iteration);
  const bool writers = is_writer_step(iteration);
  if (!console && !writers) return std::nullopt;

  // Everything the log step needs from other ranks, and the control requests, in one collective.
  parallel::ProcessGroup& world = parallel::get_world_group();
  parallel::ProcessGroup& model_parallel = parallel::get_model_parallel_group();
  utils::PackedStatistics stats;
  const std::vector<ControlRequest> requests = setup_.control().take();
  const ControlCounts counts = count_requests(requests);
  const Entry control_entry =
      stats.add("control requests", ReduceOp::kSum, world, std::vector<double>(counts.begin(), counts.end()));
  // A writer that failed at the last log step fails the run on every rank together.
  const Entry writer_failed_entry =
      stats.add("writer failed", ReduceOp::kMax, world, {writer_error_.empty() ? 0.0 : 1.0});
  const Entry on_log_entry =
      stats.add("on_log callbacks", ReduceOp::kMax, world, {should_fire(setup_.callbacks, Event::kLog) ? 1.0 : 0.0});
  // The reference shares these two with ranks that lack them; every rank here has both, so MAX is the identity.
  const Entry lr_entry = stats.add("learning-rate", ReduceOp::kMax, model_parallel, {setup_.scheduler->get_lr()});
  const Entry grad_norm_entry = stats.add("grad-norm", ReduceOp::kMax, model_parallel, {grad_norm});
  std::optional<Entry> params_entry, expert_params_entry;
  if (logging.log_params_norm) {
    params_entry =
        stats.add("params-norm^2", ReduceOp::kSum, model_parallel, {utils::local_params_norm_squared(setup_.chunks)});
    // Experts' squares add up over their own model-parallel group (the same decision on every rank).
    if (parallel::tensor_parallel::expert_parallel_groups_in_use()) {
      expert_params_entry = stats.add(
          "expert params-norm^2", ReduceOp::kSum, utils::params_norm_group(/*expert=*/true),
          {utils::local_params_norm_squared(setup_.chunks, /*force_create_fp32_copy=*/false, /*expert=*/true)});
    }
  }
  std::optional<Entry> grads_entry;
  if (writers && logging.log_l2_norm_grad_to_tensorboard) {
    const auto terms = utils::local_grad_norm_squares(setup_.chunks);
    // Once per run: the whole model's names, the same list on every rank.
    if (grad_norm_names_.empty()) grad_norm_names_ = utils::gather_parameter_names(terms);
    std::vector<double> squares = utils::align_to_names(grad_norm_names_, terms);
    grads_entry =
        stats.add("grad norms^2", ReduceOp::kSum, utils::grad_norm_terms_group(setup_.chunks), std::move(squares));
  }
  utils::StatReport memory;
  std::optional<Entry> memory_entry;
  if (writers && logging.log_memory_to_tensorboard) {
    memory = utils::report_memory();
    std::vector<double> values;
    for (const auto& entry : memory) values.push_back(utils::to_double(entry.second));
    memory_entry =
        stats.add("memory", ReduceOp::kMax, parallel::get_pipeline_model_parallel_group(), std::move(values));
  }
  stats.exchange(world);
  if (stats.scalar(writer_failed_entry) > 0.0) {
    throw std::runtime_error(writer_error_.empty() ? "writing the metrics failed on the last rank (see its log)"
                                                   : "writing the metrics failed: " + writer_error_);
  }

  LoggedStep logged;
  ControlCounts agreed_counts{};
  const std::vector<double>& summed = stats.values(control_entry);
  for (std::size_t i = 0; i < agreed_counts.size(); ++i) agreed_counts[i] = std::llround(summed[i]);
  logged.control = agree_on_control(requests, agreed_counts, world);
  logged.on_log_fired = stats.scalar(on_log_entry) > 0.0;
  const double learning_rate = stats.scalar(lr_entry);
  const double reduced_grad_norm = stats.scalar(grad_norm_entry);
  std::optional<double> params_norm;
  if (params_entry) {
    params_norm =
        std::sqrt(stats.scalar(*params_entry) + (expert_params_entry ? stats.scalar(*expert_params_entry) : 0.0));
  }

  // The record on_log callbacks see and may extend; at writer steps it is what the writers get.
  LogRecord record;
  record.iteration = iteration;
  record.eta_seconds = eta_seconds(iteration, step_end);  // a callback with a better estimate replaces it
  const double samples = static_cast<double>(train_state.consumed_train_samples);
  record.metrics["samples vs steps"] = samples;
  record.metrics["learning-rate"] = learning_rate;
  if (train_state.skipped_train_samples > 0) {
    record.metrics["skipped-train-samples"] = static_cast<double>(train_state.skipped_train_samples);
  }
  record.metrics["batch-size"] = static_cast<double>(config.train.global_batch_size);
  for (const auto& [key, value] : loss_dict) record.metrics[key] = value.item<double>();
  const double loss_scale = setup_.grad_scaler() != nullptr ? setup_.grad_scaler()->scale() : 1.0;
  if (logging.log_loss_scale_to_tensorboard) record.metrics["loss-scale"] = loss_scale;
  if (logging.log_world_size_to_tensorboard) record.metrics["world-size"] = setup_.world_size;
  if (!skipped_iter) record.metrics["grad-norm"] = reduced_grad_norm;  // a skipped step has none (Megatron: None)
  if (params_norm) record.metrics["params-norm"] = *params_norm;
  const auto add_report = [&record](const utils::StatReport& report) {
    for (const auto& [name, value] : report) record.metrics[name] = utils::to_double(value);
  };
  if (writers && logging.log_throughput_to_tensorboard) {
    add_report(utils::report_throughput(config.train, iteration, config.model.seq_length, history_wct_,
                                        logging.throughput_window_size, setup_.world_size));
  }
  if (memory_entry) {
    const std::vector<double>& maxima = stats.values(*memory_entry);
    for (std::size_t i = 0; i < memory.size(); ++i) record.metrics["memory/" + memory[i].first] = maxima[i];
  }
  if (writers && logging.log_runtime_to_tensorboard) {
    add_report(utils::report_runtime(train_state, start_wall_, config.model.seq_length, config.train.train_iters,
                                     logging.runtime_time_unit, wall_seconds()));
  }
  if (grads_entry) {
    const std::vector<double>& squares = stats.values(*grads_entry);
    double total = 0.0;
    for (std::size_t i = 0; i < squares.size(); ++i) {
      record.metrics["l2_norm/grad/" + grad_norm_names_[i]] = std::sqrt(squares[i]);
      total += squares[i];
    }
    record.metrics["l2_norm/grad/global"] = std::sqrt(total);
  }
  utils::LogLineFields line;
  std::map<std::string, double> timers;  // on_log's: what the console line reports of the interval's timing
  if (console) {
    // CUDA kernels run after the host has queued them: read the clock once the interval's work is done.
    parallel::synchronize_device(setup_.device);
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - interval_start_).count();
    interval_start_ = now;
    const int64_t iterations =
        std::max<int64_t>(1, total_loss_dict_.advanced_iterations + total_loss_dict_.skipped_iterations);
    line.elapsed_ms_per_iteration = elapsed * 1000.0 / static_cast<double>(iterations);
    timers["iteration-time"] = line.elapsed_ms_per_iteration / 1000.0;
    const double flops = std::max(train_state.floating_point_operations_so_far - flops_at_last_log_, 0.0);
    flops_at_last_log_ = train_state.floating_point_operations_so_far;
    const double tflops = elapsed > 0.0 ? flops / elapsed / setup_.world_size / 1e12 : 0.0;
    if (logging.log_throughput) line.tflops_per_device = tflops;
    // Megatron-Bridge's names and units: seconds per step, TFLOP/s per device and in all.
    if (logging.log_timers_to_tensorboard) record.metrics["iteration-time"] = line.elapsed_ms_per_iteration / 1000.0;
    if (logging.log_throughput_to_tensorboard) {
      record.metrics["throughput/tflops/device"] = tflops;
      record.metrics["throughput/tflops"] = tflops * setup_.world_size;
    }
  }
  setup_.fire_training(Event::kLog, [&](CallbackContext& ctx) {
    ctx.log = &record;
    ctx.timers = timers;
  });
  record.complete();  // what every on_log callback added is final: for those that asked to read it (ControlEndpoint)

  if (console) {
    // Until the step after the first, every data-parallel rank 0 shows its own memory (the peak with optimizer state).
    if (report_memory_flag_) {
      if (parallel::get_data_parallel_rank() == 0) {
        bridge::utils::log_info_on_this_rank("[Rank " + std::to_string(parallel::get_rank()) + "] (after " +
                                             std::to_string(iteration) + " iterations) memory (GB)" +
                                             format_memory(utils::report_memory()));
      }
      if (iteration > loaded_iteration_ + 1) report_memory_flag_ = false;
    }
    if (writer_rank_) {
      line.timestamp = utils::log_timestamp();
      line.iteration = iteration;
      line.train_iters = config.train.train_iters;
      line.elapsed_seconds = step_end;
      line.eta_seconds = record.eta_seconds;
      line.consumed_samples = train_state.consumed_train_samples;
      line.skipped_samples = train_state.skipped_train_samples;
      line.learning_rate = learning_rate;
      line.global_batch_size = config.train.global_batch_size;
      if (!skipped_iter) line.grad_norm = reduced_grad_norm;
      line.loss_scale = loss_scale;
      line.params_norm = params_norm;
      line.extra = record.text;
      bridge::utils::log_info_on_this_rank(utils::format_log_line(line, total_loss_dict_),
                                           bridge::utils::Timestamp::kInMessage);
    } else {
      utils::format_log_line(line, total_loss_dict_);  // resets the sums and counters, as on the last rank
    }
  }
  if (writers && writer_) write(record, loss_dict, iteration);
  return logged;
}

void TrainingLogger::write(const LogRecord& record, const LossDict& loss_dict, int64_t iteration) {
  // TensorBoard's "X vs samples" variants of the reference's main curves.
  static const char* const kVsSamples[] = {"learning-rate", "batch-size", "loss-scale",
                                           "world-size",    "grad-norm",  "params-norm"};
  const int64_t samples = setup_.state.train_state.consumed_train_samples;
  write_guarded("metrics", iteration, [&] {
    for (const auto& [name, value] : record.metrics) {
      writer_->add_scalar(name, value, iteration);
      const bool vs_samples = loss_dict.count(name) != 0 ||
                              std::find(std::begin(kVsSamples), std::end(kVsSamples), name) != std::end(kVsSamples);
      if (tensorboard_ && vs_samples) tensorboard_->add_scalar(name + " vs samples", value, samples);
    }
    for (const auto& [tag, text] : record.texts) writer_->add_text(tag, text, iteration);
  });
}

void TrainingLogger::write_guarded(const char* what, int64_t iteration, const std::function<void()>& writes) {
  try {
    writes();
    writer_->flush();
  } catch (const std::exception& e) {
    // Only this rank writes: keep training to the next log step, whose collective fails every rank together.
    writer_error_ = bridge::utils::describe(e);
    bridge::utils::logger().error("writing the {} of step {} failed: {}", what, iteration, writer_error_);
    writer_.reset();
    tensorboard_.reset();
  }
}

void TrainingLogger::write_evaluation(const LossDict& total, bool is_test) {
  if (!writer_) return;
  const LoggingConfig& logging = setup_.config.logging;
  const TrainState& train_state = setup_.state.train_state;
  const std::string suffix = is_test ? " test" : " validation";
  write_guarded(is_test ? "test losses" : "validation losses", train_state.step, [&] {
    for (const auto& [key, value] : total) {
      const double loss = value.item<double>();
      const double ppl = utils::validation_ppl(loss);
      const std::string tag = key + suffix;
      writer_->add_scalar(tag, loss, train_state.step);
      if (tensorboard_) tensorboard_->add_scalar(tag + " vs samples", loss, train_state.consumed_train_samples);
      if (logging.log_validation_ppl_to_tensorboard) {
        writer_->add_scalar(tag + " ppl", ppl, train_state.step);
        if (tensorboard_) tensorboard_->add_scalar(tag + " ppl vs samples", ppl, train_state.consumed_train_samples);
      }
    }
  });
}

void TrainingLogger::flush() {
  if (!writer_) return;
  try {
    writer_->flush();
  } catch (const std::exception& e) {
    bridge::utils::logger().error("flushing the metric writers failed: {}", bridge::utils::describe(e));
  }
}

}  // namespace bridge::training
