// train_utils: norms over the model-parallel group, the small reference collectives, and the reports.
#include "training/utils/train_utils.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

#include "bridge/models/gpt_model.h"
#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "training/optimizer/distrib_optimizer.h"
#include "training/utils/cuda_memory.h"
#include "utils/logging.h"

namespace bridge::training::utils {
namespace tp = parallel::tensor_parallel;

double to_double(const StatValue& value) {
  return std::visit([](auto v) { return static_cast<double>(v); }, value);
}

std::optional<StatValue> find_stat(const StatReport& report, const std::string& name) {
  for (const auto& [key, value] : report) {
    if (key == name) return value;
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, torch::Tensor>> named_model_parameters(const ModelChunks& model) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& chunk : model) {
    if (auto gpt = std::dynamic_pointer_cast<models::GPTModelImpl>(chunk)) {
      auto chunk_named = models::global_named_parameters(models::GPTModel(gpt));
      named.insert(named.end(), chunk_named.begin(), chunk_named.end());
    } else {
      for (const auto& item : chunk->named_parameters()) named.emplace_back(item.key(), item.value());
    }
  }
  return named;
}

bool counts_toward_model_norm(const torch::Tensor& param) {
  return !tp::param_is_tensor_parallel_duplicate(param) && tp::param_is_not_shared(param);
}

double local_params_norm_squared(const ModelChunks& model, bool force_create_fp32_copy, bool expert) {
  torch::NoGradGuard no_grad;
  parallel::distributed::finish_param_gathers();  // ddp.overlap_param_gather: the updated values, not a mix
  double sum = 0.0;
  for (const auto& chunk : model) {
    for (const torch::Tensor& param : chunk->parameters()) {
      if (tp::is_expert_parallel_param(param) != expert || !counts_toward_model_norm(param)) continue;
      // Half-precision parameters are measured through an fp32 copy (bridge keeps no fp32 main params).
      const bool to_fp32 =
          force_create_fp32_copy || param.scalar_type() == torch::kHalf || param.scalar_type() == torch::kBFloat16;
      const torch::Tensor measured = to_fp32 ? param.detach().to(torch::kFloat) : param.detach();
      const double norm = measured.norm().item<double>();
      sum += norm * norm;
    }
  }
  return sum;
}

parallel::ProcessGroup& params_norm_group(bool expert) {
  return expert && tp::expert_parallel_groups_in_use() ? parallel::get_expert_tensor_model_pipeline_parallel_group()
                                                       : parallel::get_model_parallel_group();
}

double calc_params_l2_norm(const ModelChunks& model, bool force_create_fp32_copy) {
  torch::Tensor dense = torch::tensor({local_params_norm_squared(model, force_create_fp32_copy)}, torch::kDouble);
  parallel::ProcessGroup& dense_group = params_norm_group(/*expert=*/false);
  if (!tp::expert_parallel_groups_in_use()) {
    dense_group.all_reduce(dense);
    return std::sqrt(dense.item<double>());
  }
  // Megatron's calc_params_l2_norm: the experts' squares over their own model-parallel group, one reduction when the
  // two groups have the same ranks.
  torch::Tensor expert =
      torch::tensor({local_params_norm_squared(model, force_create_fp32_copy, /*expert=*/true)}, torch::kDouble);
  parallel::ProcessGroup& expert_group = params_norm_group(/*expert=*/true);
  if (expert_group.global_ranks() == dense_group.global_ranks()) {
    dense.add_(expert);
    dense_group.all_reduce(dense);
    return std::sqrt(dense.item<double>());
  }
  dense_group.all_reduce(dense);
  expert_group.all_reduce(expert);
  return std::sqrt(dense.item<double>() + expert.item<double>());
}

std::optional<double> reduce_max_stat_across_model_parallel_group(std::optional<double> stat,
                                                                  parallel::ProcessGroup& mp_group) {
  torch::Tensor value = torch::tensor({stat.value_or(-1.0)}, torch::kDouble);
  mp_group.all_reduce(value, parallel::ReduceOp::kMax);
  const double reduced = value.item<double>();
  if (reduced == -1.0) return std::nullopt;
  return reduced;
}

bool logical_and_across_model_parallel_group(bool input, parallel::ProcessGroup& mp_group) {
  torch::Tensor value = torch::tensor({input ? int64_t{1} : int64_t{0}}, torch::kLong);
  mp_group.all_reduce(value, parallel::ReduceOp::kMin);
  return value.item<int64_t>() == 1;
}

StatReport reduce_max_memory_across_pp_group(const StatReport& report, parallel::ProcessGroup* pp_group) {
  if (report.empty() || pp_group == nullptr || pp_group->size() <= 1) return report;
  std::vector<double> values;
  for (const auto& entry : report) values.push_back(to_double(entry.second));
  torch::Tensor packed = torch::tensor(values, torch::kDouble);
  pp_group->all_reduce(packed, parallel::ReduceOp::kMax);
  StatReport reduced;
  for (std::size_t i = 0; i < report.size(); ++i) {
    const double value = packed[static_cast<int64_t>(i)].item<double>();
    if (std::holds_alternative<int64_t>(report[i].second)) {
      reduced.emplace_back(report[i].first, static_cast<int64_t>(std::llround(value)));
    } else {
      reduced.emplace_back(report[i].first, value);
    }
  }
  return reduced;
}

const MemoryKeys& default_memory_keys() {
  static const MemoryKeys keys = {
      {"allocated_bytes.all.current", "mem-allocated-bytes"},
      {"active_bytes.all.current", "mem-active-bytes"},
      {"inactive_split_bytes.all.current", "mem-inactive-bytes"},
      {"reserved_bytes.all.current", "mem-reserved-bytes"},
      {"allocated_bytes.all.peak", "mem-max-allocated-bytes"},
      {"active_bytes.all.peak", "mem-max-active-bytes"},
      {"inactive_split_bytes.all.peak", "mem-max-inactive-bytes"},
      {"reserved_bytes.all.peak", "mem-max-reserved-bytes"},
      {"num_alloc_retries", "mem-alloc-retires"},  // sic: the reference's key, kept for dashboards that use it
      {"allocation.all.current", "mem-allocated-count"},
  };
  return keys;
}

namespace {

const MemoryKeys& cpu_memory_keys() {
  static const MemoryKeys keys = {{"resident_bytes.current", "mem-resident-bytes"},
                                  {"resident_bytes.peak", "mem-max-resident-bytes"}};
  return keys;
}

// The OS's view of this process: resident set now (/proc/self/statm) and its peak (getrusage, KiB on Linux).
std::map<std::string, int64_t> cpu_memory_stats() {
  std::map<std::string, int64_t> stats;
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (statm >> size_pages >> resident_pages) stats["resident_bytes.current"] = resident_pages * sysconf(_SC_PAGESIZE);
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    // Linux updates the high-water mark lazily (when the resident set shrinks), so it can trail the current value.
    const auto current = stats.find("resident_bytes.current");
    stats["resident_bytes.peak"] =
        std::max(int64_t{usage.ru_maxrss} * 1024, current != stats.end() ? current->second : int64_t{0});
  }
  return stats;
}

// Rounds to 5 significant digits, as the reference's round(x, 5 - digits).
double round_significant(double value, int digits) {
  if (value == 0.0 || !std::isfinite(value)) return value;
  const double scale = std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(std::fabs(value)))));
  return std::round(value * scale) / scale;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

}  // namespace

StatReport report_memory(const std::optional<MemoryKeys>& memory_keys) {
  const bool cuda = cuda_memory_stats_available();
  const std::map<std::string, int64_t> stats = cuda ? cuda_memory_stats() : cpu_memory_stats();
  const MemoryKeys& keys = memory_keys ? *memory_keys : (cuda ? default_memory_keys() : cpu_memory_keys());
  StatReport report;
  for (const auto& [source, name] : keys) {
    const auto it = stats.find(source);
    if (it == stats.end()) continue;  // only the statistics that exist, as the reference
    if (source.find("bytes") != std::string::npos) {
      report.emplace_back(replace_all(name, "bytes", "gigabytes"),
                          round_significant(static_cast<double>(it->second) / 1e9, 5));
    } else {
      report.emplace_back(name, it->second);
    }
  }
  return report;
}

namespace {

bool any_sharded_by_distributed_optimizer(const ModelChunks& model) {
  for (const auto& [name, param] : named_model_parameters(model)) {
    if (sharded_by_distributed_optimizer(param)) return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, double>> local_grad_norm_squares(const ModelChunks& model) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, double>> terms;
  // Summed over the world (grad_norm_terms_group) with expert parallelism: a whole gradient then counts on one of its
  // replicas only, data-parallel rank 0 for a dense one and expert data-parallel rank 0 for an expert's.
  const bool over_world = &grad_norm_terms_group(model) == &parallel::get_world_group();
  const auto on_counting_replica = [&](const torch::Tensor& param) {
    if (!over_world) return true;
    return (tp::is_expert_parallel_param(param)
                ? parallel::get_expert_data_parallel_rank()
                : parallel::get_data_parallel_group(/*with_context_parallel=*/true).rank()) == 0;
  };
  for (const auto& [name, param] : named_model_parameters(model)) {
    // The last stage's tied copy of the embedding is the embedding: its gradient is counted under the embedding's name.
    // Frozen parameters keep their term (zero), so the list of names does not change when one is unfrozen.
    if (!tp::param_is_not_shared(param)) continue;
    if (sharded_by_distributed_optimizer(param)) {
      // Reduce-scattered: the reduced gradient is in the pieces each data-parallel rank owns.
      double square = 0.0;
      if (counts_toward_model_norm(param)) {
        for (const DistributedOptimizer::Piece& piece : distributed_optimizer_pieces(param)) {
          const double norm = piece.grad_view.norm().item<double>();
          square += norm * norm;
        }
      }
      terms.emplace_back(name, square);
      continue;
    }
    const torch::Tensor grad = parallel::distributed::main_grad(param);  // fp32 under mixed precision
    const bool counted = grad.defined() && counts_toward_model_norm(param) && on_counting_replica(param);
    // The norm in the gradient's own precision, squared in double: a double copy of every gradient cost 4x as much.
    const double norm = counted ? grad.norm().item<double>() : 0.0;
    terms.emplace_back(name, norm * norm);
  }
  return terms;
}

parallel::ProcessGroup& grad_norm_terms_group(const ModelChunks& model) {
  // With expert parallelism an expert's term belongs to the expert model-parallel group and a dense one's to the
  // model-parallel group; one vector of terms can only be summed over a group holding both: the world.
  if (tp::expert_parallel_groups_in_use() || any_sharded_by_distributed_optimizer(model)) {
    return parallel::get_world_group();
  }
  return parallel::get_model_parallel_group();
}

std::vector<std::string> gather_parameter_names(const std::vector<std::pair<std::string, double>>& terms) {
  std::string mine;
  for (const auto& term : terms) mine += term.first + '\n';
  std::set<std::string> names;
  for (const std::string& text : parallel::all_gather_strings(parallel::get_world_group(), mine)) {
    for (std::size_t begin = 0, end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      names.insert(text.substr(begin, end - begin));
    }
  }
  return {names.begin(), names.end()};
}

std::vector<double> align_to_names(const std::vector<std::string>& names,
                                   const std::vector<std::pair<std::string, double>>& terms) {
  std::vector<double> values(names.size(), 0.0);
  for (const auto& [name, value] : terms) {
    const auto at = std::lower_bound(names.begin(), names.end(), name);
    if (at == names.end() || *at != name) {
      throw std::logic_error("parameter '" + name +
                             "' is not among the names gathered earlier; the model's parameters must not change "
                             "during training");
    }
    values[static_cast<std::size_t>(at - names.begin())] += value;
  }
  return values;
}

StatReport report_l2_norm_grad(const ModelChunks& model) {
  const std::vector<std::pair<std::string, double>> terms = local_grad_norm_squares(model);
  const std::vector<std::string> names = gather_parameter_names(terms);
  torch::Tensor packed = torch::tensor(align_to_names(names, terms), torch::kDouble);
  grad_norm_terms_group(model).all_reduce(packed);

  StatReport report;
  double total = 0.0;
  int64_t i = 0;
  for (const std::string& name : names) {
    const double square = packed[i++].item<double>();
    total += square;
    report.emplace_back("l2_norm/grad/" + name, std::sqrt(square));
  }
  report.emplace_back("l2_norm/grad/global", std::sqrt(total));
  return report;
}

std::optional<double> seconds_per_time_unit(const std::string& time_unit) {
  static const std::map<std::string, double> kSeconds = {
      {"seconds", 1.0}, {"minutes", 60.0}, {"hours", 3600.0}, {"days", 86400.0}};
  const auto it = kSeconds.find(time_unit);
  if (it == kSeconds.end()) return std::nullopt;
  return it->second;
}

StatReport report_runtime(const TrainState& train_state, double start_time, int64_t seq_length, int64_t train_iters,
                          const std::string& time_unit, double now) {
  const std::optional<double> divisor = seconds_per_time_unit(time_unit);
  if (!divisor) {
    throw std::invalid_argument("report_runtime: time unit '" + time_unit +
                                "' is not one of seconds, minutes, hours, days (logging.runtime_time_unit)");
  }
  const double elapsed = now - start_time;
  StatReport report;
  if (train_state.step > 0 && train_iters > 0) {
    const double done = static_cast<double>(train_state.step) / static_cast<double>(train_iters);
    report.emplace_back("time/remaining_estimate", elapsed / done * (1.0 - done) / *divisor);
  }
  report.emplace_back("time/tokens", train_state.consumed_train_samples * seq_length);
  report.emplace_back("time/samples", train_state.consumed_train_samples);
  report.emplace_back("time/batches", train_state.step);
  report.emplace_back("time/total", elapsed / *divisor);
  return report;
}

StatReport report_throughput(const TrainingConfig& train_config, int64_t iteration, int64_t seq_length,
                             const std::deque<double>& history_wct, int64_t window_size, int world_size) {
  StatReport report;
  if (window_size < 2 || static_cast<int64_t>(history_wct.size()) < window_size) return report;
  const double elapsed_wct =
      history_wct.back() - history_wct[history_wct.size() - static_cast<std::size_t>(window_size)];
  if (elapsed_wct <= 0.0) {
    bridge::utils::logger().warn("elapsed_wct is {}, skipping throughput calculation at iteration {}", elapsed_wct,
                                 iteration);
    return report;
  }
  // window_size timestamps bracket window_size - 1 steps.
  const double batches = static_cast<double>(window_size - 1);
  const double samples = batches * static_cast<double>(train_config.global_batch_size);
  const double tokens = samples * static_cast<double>(seq_length);
  const double devices = static_cast<double>(std::max(1, world_size));
  report.emplace_back("throughput/batches_per_sec", batches / elapsed_wct);
  report.emplace_back("throughput/samples_per_sec", samples / elapsed_wct);
  report.emplace_back("throughput/device/batches_per_sec", batches / elapsed_wct / devices);
  report.emplace_back("throughput/device/samples_per_sec", samples / elapsed_wct / devices);
  report.emplace_back("throughput/micro_batch_size", train_config.micro_batch_size);
  report.emplace_back("throughput/global_batch_size", train_config.global_batch_size);
  if (tokens > 0) {
    report.emplace_back("throughput/tokens_per_sec", tokens / elapsed_wct);
    report.emplace_back("throughput/device/tokens_per_sec", tokens / elapsed_wct / devices);
  }
  return report;
}

}  // namespace bridge::training::utils
