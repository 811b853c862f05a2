// Megatron-Core's parallel_state: initialize_model_parallel creates this rank's tensor-, pipeline-, data-, context-
// and model-parallel groups with their combinations (dp-cp, tp-cp, tp-dp, tp-dp-cp), the embedding group (first and
// last pipeline stage), the position-embedding group (first stage) and the expert groups of MoE layers
// (expert-model, expert-tensor and expert-data parallel, see rank_layout.h), and the getters answer by Megatron's
// names.
//
//   bridge::parallel::init_distributed();
//   bridge::parallel::initialize_model_parallel(/*tp=*/2, /*pp=*/2);
//   if (bridge::parallel::is_pipeline_last_stage()) ...
//   bridge::parallel::destroy_model_parallel();
#pragma once

#include <optional>
#include <vector>

#include "parallel/process_group.h"
#include "parallel/rank_layout.h"

namespace bridge::parallel {

/// Builds the groups for `options` over the initialised world (init_distributed first). Validation errors name the
/// field (e.g. a world size not divisible by tp x pp). Throws if already initialised.
void initialize_model_parallel(const ParallelOptions& options);
void initialize_model_parallel(int tensor_model_parallel_size, int pipeline_model_parallel_size = 1,
                               std::optional<int> virtual_pipeline_model_parallel_size = std::nullopt);
bool model_parallel_is_initialized();
/// Releases the groups; the world stays initialised.
void destroy_model_parallel();

/// This rank's layout: every group as global ranks.
const RankLayout& get_rank_layout();

ProcessGroup& get_tensor_model_parallel_group();
int get_tensor_model_parallel_rank();
int get_tensor_model_parallel_world_size();

ProcessGroup& get_pipeline_model_parallel_group();
int get_pipeline_model_parallel_rank();
int get_pipeline_model_parallel_world_size();
/// Global ranks of the first/last stage and of the next/previous stage (wrapping around) in this pipeline.
int get_pipeline_model_parallel_first_rank();
int get_pipeline_model_parallel_last_rank();
int get_pipeline_model_parallel_next_rank();
int get_pipeline_model_parallel_prev_rank();
/// First/last stage; with a virtual pipeline, also the first/last model chunk unless `ignore_virtual`.
bool is_pipeline_first_stage(bool ignore_virtual = false);
bool is_pipeline_last_stage(bool ignore_virtual = false);

/// Model chunks per stage, and the chunk being run; both absent without a virtual pipeline.
std::optional<int> get_virtual_pipeline_model_parallel_world_size();
std::optional<int> get_virtual_pipeline_model_parallel_rank();
void set_virtual_pipeline_model_parallel_rank(int rank);

/// The data-parallel group (the replicas that read different batches); with `with_context_parallel`, data x context
/// parallel: all ranks with the same weights, over which gradients are reduced, the optimizer is sharded and one
/// checkpoint writer is elected. Equal without context parallelism.
ProcessGroup& get_data_parallel_group(bool with_context_parallel = false);
int get_data_parallel_rank(bool with_context_parallel = false);
int get_data_parallel_world_size(bool with_context_parallel = false);

/// The ranks that split one sequence (options.context_parallel_size), as Megatron-Core's _CONTEXT_PARALLEL_GROUP.
ProcessGroup& get_context_parallel_group();
const std::vector<int>& get_context_parallel_global_ranks();
int get_context_parallel_rank();
int get_context_parallel_world_size();

/// Tensor x pipeline: the group that reduces gradient-norm statistics.
ProcessGroup& get_model_parallel_group();
/// Tensor x data parallel; with `with_context_parallel`, tensor x data x context: every rank of a pipeline stage
/// (Megatron's _TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP, which reduces expert-bias token counts).
ProcessGroup& get_tensor_and_data_parallel_group(bool with_context_parallel = false);
/// Tensor x context parallel: the ranks holding parts of the same sequences (Megatron's
/// _TENSOR_AND_CONTEXT_PARALLEL_GROUP, the MoE aux-loss reduce group).
ProcessGroup& get_tensor_and_context_parallel_group();
int get_tensor_and_context_parallel_rank();
int get_tensor_and_context_parallel_world_size();

/// The embedding group, or nullptr on a rank outside it (middle pipeline stages).
ProcessGroup* get_embedding_group();
bool is_rank_in_embedding_group(bool ignore_virtual = false);
/// The position-embedding group, or nullptr on a rank outside it.
ProcessGroup* get_position_embedding_group();
bool is_rank_in_position_embedding_group();

/// Expert parallelism (options.expert_model_parallel_size): the ranks that hold different experts of one MoE layer and
/// exchange tokens with an all-to-all; the rank says which experts this rank holds.
ProcessGroup& get_expert_model_parallel_group();
int get_expert_model_parallel_rank();
int get_expert_model_parallel_world_size();
/// Tensor parallelism inside each expert (expert_tensor_parallel_size(options)): splits one expert's weights, as the
/// tensor-parallel group splits a dense layer's.
ProcessGroup& get_expert_tensor_parallel_group();
int get_expert_tensor_parallel_rank();
int get_expert_tensor_parallel_world_size();
/// Expert tensor x expert model parallel: the token dispatcher's group, all ranks that share one layer's experts.
ProcessGroup& get_expert_tensor_and_model_parallel_group();
/// Expert tensor x expert model x pipeline: the expert "model-parallel" group, which reduces the norms of expert
/// parameters and gradients as get_model_parallel_group() does for dense ones.
ProcessGroup& get_expert_tensor_model_pipeline_parallel_group();
/// The ranks that hold the same experts: expert gradients are reduced over it instead of the data-parallel group.
ProcessGroup& get_expert_data_parallel_group();
int get_expert_data_parallel_rank();
int get_expert_data_parallel_world_size();

}  // namespace bridge::parallel
