// Statistics of a model-parallel run (Megatron-Bridge's training/utils/train_utils.py): parameter and gradient
// norms over the right groups, the small collectives that share a statistic with ranks that lack it, and the memory,
// runtime and throughput reports that the training log writes.
//
// Every function marked "collective" must be called on every rank of the group it names, in the same order. The
// training loop does not call them one by one: it packs the same statistics into one collective per log step
// (training/utils/packed_statistics.h); these are the reference semantics, for callbacks and tests.
//
//   double norm = utils::calc_params_l2_norm(ctx.model);  // every rank, e.g. in on_train_step_end
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "parallel/process_group.h"
#include "training/callbacks/callback_context.h"
#include "training/config/config.h"
#include "training/state.h"

namespace bridge::training::utils {

/// A reported statistic: counters stay integers through the reductions here (the writers take doubles).
using StatValue = std::variant<int64_t, double>;
/// Named statistics in report order (the reference's dict).
using StatReport = std::vector<std::pair<std::string, StatValue>>;

double to_double(const StatValue& value);

/// Megatron's validation perplexity: exp of the loss, capped at exp(20) so that a diverged loss still prints.
inline double validation_ppl(double loss) { return std::exp(std::min(20.0, loss)); }
/// The value under `name`, if the report has it.
std::optional<StatValue> find_stat(const StatReport& report, const std::string& name);

/// The chunks' parameters under names that are the same in every parallel layout: GPT chunks give Megatron-Core's
/// global names ("decoder.layers.7.mlp.linear_fc1.weight"); other modules their own names.
std::vector<std::pair<std::string, torch::Tensor>> named_model_parameters(const ModelChunks& model);

/// Whether this rank counts `param` in a norm over the model-parallel group: tensor-parallel shards always,
/// replicated parameters on tensor-parallel rank 0 only, and never the last stage's copy of a tied embedding.
bool counts_toward_model_norm(const torch::Tensor& param);

/// This rank's share of the squared parameter norm of its dense parameters (with `expert`, of its expert-parallel
/// ones, ParamAttributes::allreduce false): the sum over the parameters it counts (see above), in fp32 for
/// half-precision parameters or with `force_create_fp32_copy`, accumulated in double. Sum the shares over
/// params_norm_group(expert).
double local_params_norm_squared(const ModelChunks& model, bool force_create_fp32_copy = false, bool expert = false);

/// Where the shares of local_params_norm_squared add up: the model-parallel group (tp x pp) for dense parameters; for
/// expert ones the expert tensor x model x pipeline group when parallel_state's layout has expert parallelism
/// (tensor_parallel::expert_parallel_groups_in_use(), the same on every rank), else the model-parallel group.
parallel::ProcessGroup& params_norm_group(bool expert);

/// Collective over the model-parallel group (tp x pp), and with expert parallelism over the expert tensor x model x
/// pipeline group too: the L2 norm of the whole model's parameters, each expert counted once, equal on every rank and
/// in every layout. Replicated parameters are identical across data-parallel (expert data-parallel) replicas, so
/// nothing is reduced over dp: the parameters are whole on every rank even under the distributed optimizer (its
/// shards are all-gathered after each step), so the reference's sharded buckets are empty.
double calc_params_l2_norm(const ModelChunks& model, bool force_create_fp32_copy = false);

/// Collective over `mp_group`: the maximum of `stat` over the ranks that have one (nullopt on ranks without it, e.g.
/// without parameters); nullopt if none has. A MAX all-reduce with -1 standing for "none", as the reference.
std::optional<double> reduce_max_stat_across_model_parallel_group(std::optional<double> stat,
                                                                  parallel::ProcessGroup& mp_group);

/// Collective over `mp_group`: true only if `input` is true on every rank (an integer MIN all-reduce).
bool logical_and_across_model_parallel_group(bool input, parallel::ProcessGroup& mp_group);

/// Collective over `pp_group` (one MAX all-reduce for all keys): the per-key maximum over pipeline stages, so the
/// last rank, which writes the metrics, reports the first stage's larger activation peak. Integer values stay
/// integers. Returns `report` unchanged when it is empty, `pp_group` is null or has one rank (the same ranks must
/// agree on that, as in the reference).
StatReport reduce_max_memory_across_pp_group(const StatReport& report, parallel::ProcessGroup* pp_group);

/// Allocator statistic -> reported name, the reference's MEMORY_KEYS for CUDA.
using MemoryKeys = std::vector<std::pair<std::string, std::string>>;
const MemoryKeys& default_memory_keys();

/// This process's memory. With CUDA: the caching allocator's statistics named by `memory_keys` (default: the
/// reference's 10), values of stats whose source name contains "bytes" in gigabytes (5 significant digits) and
/// renamed "...-gigabytes". On CPU, from the OS: "mem-resident-gigabytes" (resident set now) and
/// "mem-max-resident-gigabytes" (its peak); `memory_keys` then selects and renames among "resident_bytes.current"
/// and "resident_bytes.peak".
StatReport report_memory(const std::optional<MemoryKeys>& memory_keys = std::nullopt);

/// One term per named parameter: this rank's share of its squared gradient norm (a partial sum for tensor-parallel
/// shards, zero for tensor-parallel duplicates and parameters without a gradient), under its layout-independent name.
/// The last stage's copy of a tied embedding has no term of its own: it is the embedding. Under the distributed
/// optimizer a rank's share is that of the pieces it owns; with expert parallelism and no distributed optimizer a whole
/// gradient counts on data-parallel rank 0 only (an expert's on expert data-parallel rank 0). Sum the terms over
/// grad_norm_terms_group().
std::vector<std::pair<std::string, double>> local_grad_norm_squares(const ModelChunks& model);

/// Where local_grad_norm_squares' terms add up to whole norms: the model-parallel group, or the world when the
/// distributed optimizer shards the gradients over the data-parallel ranks too or the layout has expert parallelism
/// (dense and expert terms add up over different groups, and the world holds both).
parallel::ProcessGroup& grad_norm_terms_group(const ModelChunks& model);

/// Collective over the world (two collectives): the names of `terms` on every rank, merged and sorted, the same list
/// everywhere: the layout of the whole model's per-parameter values.
std::vector<std::string> gather_parameter_names(const std::vector<std::pair<std::string, double>>& terms);

/// `terms` placed at their names' positions in `names` (from gather_parameter_names), zero elsewhere. Throws
/// std::logic_error for a name not in the list.
std::vector<double> align_to_names(const std::vector<std::string>& names,
                                   const std::vector<std::pair<std::string, double>>& terms);

/// Collective over grad_norm_terms_group (names gathered over the world once per call, values summed over mp):
/// "l2_norm/grad/<name>" for every parameter of the whole model, in name order, then "l2_norm/grad/global", the norm
/// of all of them. Differs from the reference, whose "global" re-accumulates inside the chunk loop over every value
/// so far, previous "global"s included (74.92 instead of 16.88 for grads 0..9), and which reports only this rank's
/// parameters: here "global" is the gradient norm of the whole model, the same on every rank and layout. Called after
/// the optimizer step, as the loop does, it measures the gradients after clipping.
StatReport report_l2_norm_grad(const ModelChunks& model);

/// Seconds in one "seconds", "minutes", "hours" or "days"; nothing for another name.
std::optional<double> seconds_per_time_unit(const std::string& time_unit);

/// "time/remaining_estimate" (elapsed / done fraction x fraction left, omitted before the first step),
/// "time/tokens", "time/samples", "time/batches", "time/total", times in `time_unit` (seconds, minutes, hours or
/// days). `start_time` and `now` are wall-clock seconds.
StatReport report_runtime(const TrainState& train_state, double start_time, int64_t seq_length, int64_t train_iters,
                          const std::string& time_unit, double now);

/// Rolling throughput over the last `window_size` steps: `history_wct` holds the wall-clock time at the end of each
/// recent step, newest last. Returns {} until it holds window_size entries, and (with a warning) when no time
/// passed. Rates are per second, in total and per device (divided by `world_size`):
/// "throughput/{batches,samples,tokens}_per_sec", "throughput/device/...", and the batch sizes. Differs from the
/// reference, which keeps window_size + 1 timestamps, so its rate counts window_size - 1 batches over window_size
/// intervals; here window_size timestamps span window_size - 1 intervals of as many batches.
StatReport report_throughput(const TrainingConfig& train_config, int64_t iteration, int64_t seq_length,
                             const std::deque<double>& history_wct, int64_t window_size, int world_size);

}  // namespace bridge::training::utils
