// Megatron's forward/backward schedules: see schedules.h.
//
// The 1F1B schedule follows Megatron's structure: warmup forwards, steady one-forward-one-backward pairs with the
// combined exchanges, cooldown backwards. The interleaved schedule runs Megatron's order of passes
// (get_interleaved_order) as a dataflow program instead of Megatron's hand-paired exchanges: an activation or gradient
// is sent without waiting as soon as it exists, and received just before the pass that needs it. Each (peer, tag)
// stream is first-in first-out and every rank walks the same schedule table, so the n-th tensor received from a
// neighbour is exactly the one the n-th pass that needs it expects; no bookkeeping of which chunk a tensor is for
// can go wrong, and the program is deadlock-free whenever the order has no cyclic dependency (the unit test checks
// this for many layouts).
#include "parallel/pipeline_parallel/schedules.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>

#include "parallel/parallel_state.h"
#include "parallel/pipeline_parallel/p2p_communication.h"
#include "utils/check.h"

namespace bridge::parallel::pipeline_parallel {
namespace {

std::string str(int64_t value) { return std::to_string(value); }

using utils::require;

// Checks the options every schedule needs; `where` names the schedule in the message.
void validate(const ForwardBackwardOptions& o, int64_t expected_chunks, bool needs_shape, const std::string& where) {
  require(static_cast<bool>(o.forward_step_func),
          where + ": ForwardBackwardOptions::forward_step_func is empty; set it to run one micro-batch of a chunk");
  require(o.num_microbatches >= 1,
          where + ": ForwardBackwardOptions::num_microbatches must be >= 1, got " + str(o.num_microbatches));
  require(static_cast<int64_t>(o.set_input_tensor.size()) == expected_chunks,
          where + ": ForwardBackwardOptions::set_input_tensor has " +
              str(static_cast<int64_t>(o.set_input_tensor.size())) + " entries but this rank runs " +
              str(expected_chunks) +
              " model chunk(s); give one per chunk (the virtual pipeline size, or 1 without one)");
  for (std::size_t chunk = 0; chunk < o.set_input_tensor.size(); ++chunk) {
    require(static_cast<bool>(o.set_input_tensor[chunk]),
            where + ": ForwardBackwardOptions::set_input_tensor[" + std::to_string(chunk) + "] is empty");
  }
  if (needs_shape) {
    require(!o.tensor_shape.empty(), where +
                                         ": ForwardBackwardOptions::tensor_shape is empty but pipeline stages exchange "
                                         "activations; set it to e.g. {seq, micro_batch, hidden}");
    for (int64_t dim : o.tensor_shape) {
      require(dim > 0, where + ": ForwardBackwardOptions::tensor_shape has a non-positive dimension " + str(dim));
    }
  }
}

// Runs chunk `chunk` with parallel_state's virtual pipeline rank set to it, restoring the previous one after.
class ChunkScope {
 public:
  explicit ChunkScope(int64_t chunk) : previous_(get_virtual_pipeline_model_parallel_rank()) {
    if (previous_) set_virtual_pipeline_model_parallel_rank(static_cast<int>(chunk));
  }
  ~ChunkScope() {
    if (previous_) set_virtual_pipeline_model_parallel_rank(*previous_);
  }
  ChunkScope(const ChunkScope&) = delete;
  ChunkScope& operator=(const ChunkScope&) = delete;

 private:
  std::optional<int> previous_;
};

// The forward and backward pass of one micro-batch of one chunk, shared by every schedule: loss normalisation,
// hooks, grad-sync control and the collection of reported values.
class StepRunner {
 public:
  StepRunner(const ForwardBackwardOptions& options, int64_t num_chunks)
      : o_(options),
        total_backwards_(options.num_microbatches * num_chunks),
        reported_(static_cast<std::size_t>(options.num_microbatches)) {}

  torch::Tensor forward(int64_t microbatch, int64_t chunk, const torch::Tensor& input) {
    ChunkScope scope(chunk);
    o_.set_input_tensor[static_cast<std::size_t>(chunk)](input);
    if (o_.hooks.on_forward_start) o_.hooks.on_forward_start(microbatch, chunk);
    auto [output, loss_func] = o_.forward_step_func(microbatch, chunk);
    const std::string where = "forward_step_func(microbatch " + str(microbatch) + ", model_chunk " + str(chunk) + ")";
    if (is_pipeline_last_stage()) {
      require(static_cast<bool>(loss_func), where + " returned no loss function on the last pipeline stage");
      LossOutput loss = loss_func(output);
      require(loss.loss.defined() && loss.loss.numel() == 1,
              where + ": the loss function must return a defined scalar LossOutput::loss");
      output = loss.loss;
      // Per-token mode leaves sums for finalize to divide by the global token count; a legacy loss (already a mean)
      // is always averaged over the micro-batches, as Megatron does.
      if (!loss.num_tokens.defined()) {
        output = output / static_cast<double>(o_.num_microbatches);
      } else if (!o_.calculate_per_token_loss) {
        output = output / micro_batch_tokens(loss.num_tokens).to(output.scalar_type()) /
                 static_cast<double>(o_.num_microbatches);
      }
      reported_[static_cast<std::size_t>(microbatch)] = std::move(loss.reported);
    } else {
      require(output.defined(), where + " returned an undefined output on a stage that sends it on");
    }
    if (o_.hooks.on_forward_end) o_.hooks.on_forward_end(microbatch, chunk, output);
    return output;
  }

  // Returns the gradient of `input` (undefined on the first stage), to send to the previous stage.
  torch::Tensor backward(int64_t microbatch, int64_t chunk, const torch::Tensor& input, const torch::Tensor& output,
                         const torch::Tensor& output_grad) {
    ChunkScope scope(chunk);
    ++backwards_done_;
    if (o_.set_grad_sync) o_.set_grad_sync(backwards_done_ == total_backwards_);
    if (o_.hooks.on_backward_start) o_.hooks.on_backward_start(microbatch, chunk);
    if (output_grad.defined()) {
      torch::autograd::backward({output}, {output_grad});
    } else {
      // The last stage's scalar loss (scaled for fp16): implicit gradient one.
      torch::autograd::backward({o_.grad_scale_func ? o_.grad_scale_func(output) : output});
    }
    torch::Tensor input_grad;
    if (input.defined()) {
      // A chunk that ignores its input still owes the previous stage a gradient of the agreed shape.
      input_grad = input.grad().defined() ? input.grad() : torch::zeros_like(input);
    }
    if (o_.hooks.on_backward_end) o_.hooks.on_backward_end(microbatch, chunk);
    return input_grad;
  }

  // The tokens the micro-batch's loss is averaged over. Under context parallelism each rank holds part of every
  // sequence and its own count of unmasked tokens: the loss is divided by the count over the whole cp group and
  // multiplied by cp, so that the gradient mean over dp x cp (DistributedDataParallel) is exactly the gradient of
  // the micro-batch's token mean, whatever share of the tokens each rank held. (Megatron-Core divides by the local
  // count, which is the same only when the ranks hold equal counts.)
  torch::Tensor micro_batch_tokens(const torch::Tensor& local) const {
    ProcessGroup& context_parallel = get_context_parallel_group();
    if (context_parallel.size() == 1) return local.clamp_min(1);
    torch::Tensor total = local.detach().to(torch::kFloat64).reshape({1}).clone();
    context_parallel.all_reduce(total);
    return total.reshape({}).clamp_min(1) / static_cast<double>(context_parallel.size());
  }

  ReportedValues finish() {
    if (!o_.forward_only && o_.finalize_model_grads) o_.finalize_model_grads();
    if (!is_pipeline_last_stage(/*ignore_virtual=*/true)) return {};
    return std::move(reported_);
  }

 private:
  const ForwardBackwardOptions& o_;
  int64_t total_backwards_;
  int64_t backwards_done_ = 0;
  ReportedValues reported_;
};

// An activation or gradient kept from its forward pass until its backward pass.
struct InFlight {
  int64_t microbatch;
  torch::Tensor input;
  torch::Tensor output;
};

InFlight pop_front(std::deque<InFlight>& queue, int64_t expected_microbatch) {
  if (queue.empty() || queue.front().microbatch != expected_microbatch) {
    throw std::logic_error("pipeline schedule: the backward pass of micro-batch " + str(expected_microbatch) +
                           " found no matching forward pass (a bug in the schedule)");
  }
  InFlight front = std::move(queue.front());
  queue.pop_front();
  return front;
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> get_schedule_table(int64_t num_microbatches, int64_t num_model_chunks,
                                                            int64_t microbatch_group_size_per_vp_stage) {
  require(microbatch_group_size_per_vp_stage >= 1,
          "get_schedule_table: microbatch_group_size_per_vp_stage must be >= 1, got " +
              str(microbatch_group_size_per_vp_stage));
  std::vector<std::pair<int64_t, int64_t>> table;
  for (int64_t start = 0; start < num_microbatches; start += microbatch_group_size_per_vp_stage) {
    // The last group takes every remaining micro-batch, so a remainder joins it rather than forming its own group.
    const int64_t end = start + microbatch_group_size_per_vp_stage >= num_microbatches
                            ? num_microbatches
                            : start + microbatch_group_size_per_vp_stage;
    for (int64_t chunk = 0; chunk < num_model_chunks; ++chunk) {
      for (int64_t microbatch = start; microbatch < end; ++microbatch) table.emplace_back(microbatch, chunk);
    }
    if (end == num_microbatches) break;
  }
  return table;
}

int64_t num_warmup_microbatches(int64_t pp, int64_t rank, int64_t num_microbatches) {
  return std::min(pp - rank - 1, num_microbatches);
}

int64_t num_interleaved_warmup_microbatches(int64_t pp, int64_t rank, int64_t num_microbatches,
                                            int64_t num_model_chunks, int64_t microbatch_group_size_per_vp_stage) {
  // Every rank first runs (v - 1) groups so that the last chunk has work; earlier stages run 2 more per stage of
  // distance from the end, as the backward passes reach them later.
  return std::min((pp - rank - 1) * 2 + (num_model_chunks - 1) * microbatch_group_size_per_vp_stage,
                  num_microbatches * num_model_chunks);
}

std::vector<ScheduleStep> get_1f1b_order(int64_t pp, int64_t rank, int64_t num_microbatches, bool forward_only) {
  const int64_t warmup = forward_only ? num_microbatches : num_warmup_microbatches(pp, rank, num_microbatches);
  std::vector<ScheduleStep> order;
  for (int64_t i = 0; i < warmup; ++i) order.push_back({true, i, 0});
  for (int64_t i = 0; i < num_microbatches - warmup; ++i) {
    order.push_back({true, warmup + i, 0});
    order.push_back({false, i, 0});
  }
  for (int64_t i = num_microbatches - warmup; i < num_microbatches && !forward_only; ++i)
    order.push_back({false, i, 0});
  return order;
}

std::vector<ScheduleStep> get_interleaved_order(int64_t pp, int64_t rank, int64_t num_microbatches,
                                                int64_t num_model_chunks, int64_t microbatch_group_size_per_vp_stage,
                                                bool forward_only) {
  const auto table = get_schedule_table(num_microbatches, num_model_chunks, microbatch_group_size_per_vp_stage);
  const auto total = static_cast<int64_t>(table.size());
  const int64_t warmup = forward_only
                             ? total
                             : num_interleaved_warmup_microbatches(pp, rank, num_microbatches, num_model_chunks,
                                                                   microbatch_group_size_per_vp_stage);
  const auto forward = [&](int64_t k) {
    return ScheduleStep{true, table[static_cast<std::size_t>(k)].first, table[static_cast<std::size_t>(k)].second};
  };
  // Backward passes walk the same table with the chunks reversed: the last chunk's gradients come first.
  const auto backward = [&](int64_t k) {
    return ScheduleStep{false, table[static_cast<std::size_t>(k)].first,
                        num_model_chunks - 1 - table[static_cast<std::size_t>(k)].second};
  };
  std::vector<ScheduleStep> order;
  for (int64_t k = 0; k < warmup; ++k) order.push_back(forward(k));
  for (int64_t k = 0; k < total - warmup; ++k) {
    order.push_back(forward(warmup + k));
    order.push_back(backward(k));
  }
  for (int64_t k = total - warmup; k < total && !forward_only; ++k) order.push_back(backward(k));
  return order;
}

void check_interleaved_schedule(int64_t pp, int64_t num_microbatches, int64_t microbatch_group_size_per_vp_stage) {
  const int64_t m = num_microbatches;
  const int64_t g = microbatch_group_size_per_vp_stage;
  const std::string where = "forward_backward_pipelining_with_interleaving: ";
  require(m >= 1, where + "ForwardBackwardOptions::num_microbatches must be >= 1, got " + str(m));
  require(g >= pp, where + "ForwardBackwardOptions::microbatch_group_size_per_vp_stage is " + str(g) +
                       " but must be >= the pipeline-parallel size " + str(pp));
  require(g <= m, where + "ForwardBackwardOptions::microbatch_group_size_per_vp_stage is " + str(g) +
                      " but must be <= num_microbatches " + str(m) + " (the default is the pipeline-parallel size " +
                      str(pp) + ": use at least that many micro-batches)");
  require(m % g == 0 || m % g >= pp,
          where + "ForwardBackwardOptions::num_microbatches " + str(m) + " leaves a remainder of " + str(m % g) +
              " micro-batches over microbatch_group_size_per_vp_stage " + str(g) +
              "; it must be 0 or >= the pipeline-parallel size " + str(pp) +
              ", otherwise the schedule has dependency bubbles. Use a multiple of " + str(g) + " micro-batches");
}

ReportedValues forward_backward_no_pipelining(const ForwardBackwardOptions& o) {
  const std::string where = "forward_backward_no_pipelining";
  require(get_pipeline_model_parallel_world_size() == 1,
          where + ": the pipeline-parallel size is " + str(get_pipeline_model_parallel_world_size()) +
              "; use get_forward_backward_func() to pick the pipelined schedule");
  validate(o, 1, false, where);
  std::optional<torch::NoGradGuard> no_grad;
  if (o.forward_only) no_grad.emplace();
  StepRunner runner(o, 1);
  for (int64_t microbatch = 0; microbatch < o.num_microbatches; ++microbatch) {
    torch::Tensor output = runner.forward(microbatch, 0, {});
    if (!o.forward_only) runner.backward(microbatch, 0, {}, output, {});
  }
  return runner.finish();
}

ReportedValues forward_backward_pipelining_without_interleaving(const ForwardBackwardOptions& o) {
  const std::string where = "forward_backward_pipelining_without_interleaving";
  if (const std::optional<int> chunks = get_virtual_pipeline_model_parallel_world_size()) {
    throw std::invalid_argument(where + ": parallel_state has a virtual pipeline of " + std::to_string(*chunks) +
                                " chunks; use forward_backward_pipelining_with_interleaving (get_forward_backward_func "
                                "picks it)");
  }
  validate(o, 1, get_pipeline_model_parallel_world_size() > 1, where);
  std::optional<torch::NoGradGuard> no_grad;
  if (o.forward_only) no_grad.emplace();
  const TensorSpec spec{o.tensor_shape, o.dtype, o.device};
  const bool input_needs_grad = !o.forward_only;
  const int64_t m = o.num_microbatches;
  const int64_t warmup =
      num_warmup_microbatches(get_pipeline_model_parallel_world_size(), get_pipeline_model_parallel_rank(), m);
  const int64_t remaining = m - warmup;
  StepRunner runner(o, 1);
  std::deque<InFlight> in_flight;  // at most pp - rank micro-batches: what 1F1B bounds memory to

  for (int64_t i = 0; i < warmup; ++i) {
    torch::Tensor input = recv_forward(spec, input_needs_grad);
    torch::Tensor output = runner.forward(i, 0, input);
    send_forward(output, spec);
    if (!o.forward_only) in_flight.push_back({i, std::move(input), std::move(output)});
  }

  torch::Tensor input = remaining > 0 ? recv_forward(spec, input_needs_grad) : torch::Tensor();
  for (int64_t i = 0; i < remaining; ++i) {
    const bool last_iteration = i == remaining - 1;
    torch::Tensor output = runner.forward(warmup + i, 0, input);
    if (o.forward_only) {
      send_forward(output, spec);
      if (!last_iteration) input = recv_forward(spec, input_needs_grad);
      continue;
    }
    torch::Tensor output_grad = send_forward_recv_backward(output, spec);
    in_flight.push_back({warmup + i, std::move(input), std::move(output)});
    InFlight oldest = pop_front(in_flight, i);
    torch::Tensor input_grad = runner.backward(i, 0, oldest.input, oldest.output, output_grad);
    if (last_iteration) {
      input = torch::Tensor();
      send_backward(input_grad, spec);
    } else {
      input = send_backward_recv_forward(input_grad, spec, input_needs_grad);
    }
  }

  for (int64_t i = remaining; i < m && !o.forward_only; ++i) {
    InFlight oldest = pop_front(in_flight, i);
    torch::Tensor output_grad = recv_backward(spec);
    torch::Tensor input_grad = runner.backward(i, 0, oldest.input, oldest.output, output_grad);
    send_backward(input_grad, spec);
  }
  return runner.finish();
}

ReportedValues forward_backward_pipelining_with_interleaving(const ForwardBackwardOptions& o) {
  const std::string where = "forward_backward_pipelining_with_interleaving";
  const std::optional<int> chunks = get_virtual_pipeline_model_parallel_world_size();
  require(chunks.has_value(), where +
                                  ": parallel_state has no virtual pipeline; pass "
                                  "virtual_pipeline_model_parallel_size to initialize_model_parallel, or use "
                                  "get_forward_backward_func()");
  const int64_t pp = get_pipeline_model_parallel_world_size();
  const int64_t v = *chunks;
  validate(o, v, true, where);
  const int64_t group = o.microbatch_group_size_per_vp_stage.value_or(pp);
  check_interleaved_schedule(pp, o.num_microbatches, group);
  std::optional<torch::NoGradGuard> no_grad;
  if (o.forward_only) no_grad.emplace();
  const TensorSpec spec{o.tensor_shape, o.dtype, o.device};
  const bool input_needs_grad = !o.forward_only;
  StepRunner runner(o, v);
  std::vector<std::deque<InFlight>> in_flight(static_cast<std::size_t>(v));
  std::deque<Work> sends;  // started, not yet known to be done; the receiver takes them in order

  const auto start_send = [&](const torch::Tensor& send_next, const torch::Tensor& send_prev) {
    P2PTransfers transfers = start_communication(send_next, send_prev, false, false, spec);
    for (Work& work : transfers.works) sends.push_back(std::move(work));
  };

  for (const ScheduleStep& step :
       get_interleaved_order(pp, get_pipeline_model_parallel_rank(), o.num_microbatches, v, group, o.forward_only)) {
    ChunkScope scope(step.model_chunk);
    std::deque<InFlight>& queue = in_flight[static_cast<std::size_t>(step.model_chunk)];
    if (step.forward) {
      torch::Tensor input;
      if (!is_pipeline_first_stage()) input = communicate({}, {}, true, false, spec, input_needs_grad).from_prev;
      torch::Tensor output = runner.forward(step.microbatch, step.model_chunk, input);
      if (!is_pipeline_last_stage()) start_send(output, {});
      if (!o.forward_only) queue.push_back({step.microbatch, std::move(input), std::move(output)});
    } else {
      torch::Tensor output_grad;
      if (!is_pipeline_last_stage()) output_grad = communicate({}, {}, false, true, spec, false).from_next;
      InFlight oldest = pop_front(queue, step.microbatch);
      torch::Tensor input_grad =
          runner.backward(step.microbatch, step.model_chunk, oldest.input, oldest.output, output_grad);
      if (!is_pipeline_first_stage()) start_send({}, input_grad);
    }
    while (!sends.empty() && sends.front().is_completed()) {
      sends.front().wait();  // surfaces a failure; returns at once
      sends.pop_front();
    }
  }
  for (Work& work : sends) work.wait();
  return runner.finish();
}

ForwardBackwardFunc get_forward_backward_func() {
  if (get_pipeline_model_parallel_world_size() == 1) return &forward_backward_no_pipelining;
  if (get_virtual_pipeline_model_parallel_world_size()) return &forward_backward_pipelining_with_interleaving;
  return &forward_backward_pipelining_without_interleaving;
}

}  // namespace bridge::parallel::pipeline_parallel
