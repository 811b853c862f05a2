// parallel_state: the process-wide groups of this rank, created in one fixed order on every rank so that no two
// ranks wait on each other's groups.
#include "parallel/parallel_state.h"

#include <memory>
#include <stdexcept>

#include "parallel/distributed.h"

namespace bridge::parallel {
namespace {

struct State {
  RankLayout layout;
  std::shared_ptr<ProcessGroup> tensor, pipeline, data, data_with_cp, context, model, tensor_and_data, embedding,
      position_embedding;
  std::optional<int> virtual_pipeline_rank;  // set iff there is a virtual pipeline, as in Megatron
};

std::unique_ptr<State>& state() {
  static std::unique_ptr<State> s;
  return s;
}

State& require_state(const char* caller) {
  if (!state()) {
    throw std::logic_error(std::string(caller) +
                           ": model parallel is not initialised; call bridge::parallel::initialize_model_parallel()");
  }
  return *state();
}

}  // namespace

void initialize_model_parallel(const ParallelOptions& options) {
  if (state()) throw std::logic_error("initialize_model_parallel: already initialised; call destroy_model_parallel()");
  if (!is_distributed_initialized()) {
    throw std::logic_error("initialize_model_parallel: call bridge::parallel::init_distributed() first");
  }
  auto s = std::make_unique<State>();
  s->layout = compute_rank_layout(get_world_size(), get_rank(), options);
  const RankLayout& l = s->layout;
  // Every rank is in exactly one group of each kind, and all ranks go through the kinds in this order.
  s->tensor = new_group("tp", l.tensor_model_parallel);
  s->pipeline = new_group("pp", l.pipeline_model_parallel);
  s->data = new_group("dp", l.data_parallel);
  // With cp = 1 these equal the dp group and a group of one: no second Gloo mesh for the same ranks.
  s->data_with_cp = options.context_parallel_size == 1 ? s->data : new_group("dp-cp", l.data_parallel_with_cp);
  s->context = new_group("cp", l.context_parallel);
  s->model = new_group("mp", l.model_parallel);
  s->tensor_and_data = new_group("tp-dp", l.tensor_and_data_parallel);
  if (!l.embedding.empty()) s->embedding = new_group("embd", l.embedding);
  if (!l.position_embedding.empty()) s->position_embedding = new_group("pos-embd", l.position_embedding);
  if (options.virtual_pipeline_model_parallel_size) s->virtual_pipeline_rank = 0;
  state() = std::move(s);
}

void initialize_model_parallel(int tensor_model_parallel_size, int pipeline_model_parallel_size,
                               std::optional<int> virtual_pipeline_model_parallel_size) {
  ParallelOptions options;
  options.tensor_model_parallel_size = tensor_model_parallel_size;
  options.pipeline_model_parallel_size = pipeline_model_parallel_size;
  options.virtual_pipeline_model_parallel_size = virtual_pipeline_model_parallel_size;
  initialize_model_parallel(options);
}

bool model_parallel_is_initialized() { return state() != nullptr; }
void destroy_model_parallel() { state().reset(); }

const RankLayout& get_rank_layout() { return require_state("get_rank_layout").layout; }

ProcessGroup& get_tensor_model_parallel_group() { return *require_state("get_tensor_model_parallel_group").tensor; }
int get_tensor_model_parallel_rank() { return get_tensor_model_parallel_group().rank(); }
int get_tensor_model_parallel_world_size() { return get_tensor_model_parallel_group().size(); }

ProcessGroup& get_pipeline_model_parallel_group() {
  return *require_state("get_pipeline_model_parallel_group").pipeline;
}
int get_pipeline_model_parallel_rank() { return get_pipeline_model_parallel_group().rank(); }
int get_pipeline_model_parallel_world_size() { return get_pipeline_model_parallel_group().size(); }

int get_pipeline_model_parallel_first_rank() { return get_pipeline_model_parallel_group().global_ranks().front(); }
int get_pipeline_model_parallel_last_rank() { return get_pipeline_model_parallel_group().global_ranks().back(); }
int get_pipeline_model_parallel_next_rank() {
  const ProcessGroup& pp = get_pipeline_model_parallel_group();
  return pp.global_ranks()[static_cast<std::size_t>((pp.rank() + 1) % pp.size())];
}
int get_pipeline_model_parallel_prev_rank() {
  const ProcessGroup& pp = get_pipeline_model_parallel_group();
  return pp.global_ranks()[static_cast<std::size_t>((pp.rank() - 1 + pp.size()) % pp.size())];
}

bool is_pipeline_first_stage(bool ignore_virtual) {
  const std::optional<int> chunk = get_virtual_pipeline_model_parallel_rank();
  if (!ignore_virtual && chunk && *chunk != 0) return false;
  return get_pipeline_model_parallel_rank() == 0;
}

bool is_pipeline_last_stage(bool ignore_virtual) {
  const std::optional<int> chunks = get_virtual_pipeline_model_parallel_world_size();
  const std::optional<int> chunk = get_virtual_pipeline_model_parallel_rank();
  if (!ignore_virtual && chunks && chunk && *chunk != *chunks - 1) return false;
  return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1;
}

std::optional<int> get_virtual_pipeline_model_parallel_world_size() {
  return require_state("get_virtual_pipeline_model_parallel_world_size")
      .layout.options.virtual_pipeline_model_parallel_size;
}
std::optional<int> get_virtual_pipeline_model_parallel_rank() {
  return require_state("get_virtual_pipeline_model_parallel_rank").virtual_pipeline_rank;
}
void set_virtual_pipeline_model_parallel_rank(int rank) {
  State& s = require_state("set_virtual_pipeline_model_parallel_rank");
  const std::optional<int> chunks = s.layout.options.virtual_pipeline_model_parallel_size;
  if (!chunks) {
    throw std::logic_error(
        "set_virtual_pipeline_model_parallel_rank: there is no virtual pipeline; pass "
        "virtual_pipeline_model_parallel_size to initialize_model_parallel");
  }
  if (rank < 0 || rank >= *chunks) {
    throw std::invalid_argument("set_virtual_pipeline_model_parallel_rank: " + std::to_string(rank) +
                                " is not in [0, " + std::to_string(*chunks) + ")");
  }
  s.virtual_pipeline_rank = rank;
}

ProcessGroup& get_data_parallel_group(bool with_context_parallel) {
  State& s = require_state("get_data_parallel_group");
  return with_context_parallel ? *s.data_with_cp : *s.data;
}
ProcessGroup& get_context_parallel_group() { return *require_state("get_context_parallel_group").context; }
int get_data_parallel_rank() { return get_data_parallel_group().rank(); }
int get_data_parallel_world_size() { return get_data_parallel_group().size(); }

ProcessGroup& get_model_parallel_group() { return *require_state("get_model_parallel_group").model; }
ProcessGroup& get_tensor_and_data_parallel_group() {
  return *require_state("get_tensor_and_data_parallel_group").tensor_and_data;
}

ProcessGroup* get_embedding_group() { return require_state("get_embedding_group").embedding.get(); }
bool is_rank_in_embedding_group(bool ignore_virtual) {
  if (get_embedding_group() == nullptr) return false;
  if (ignore_virtual) return true;
  // With a virtual pipeline, only the first chunk of the first stage and the last chunk of the last stage hold an
  // embedding.
  if (get_pipeline_model_parallel_rank() == 0) return is_pipeline_first_stage();
  return is_pipeline_last_stage();
}

ProcessGroup* get_position_embedding_group() {
  return require_state("get_position_embedding_group").position_embedding.get();
}
bool is_rank_in_position_embedding_group() { return get_position_embedding_group() != nullptr; }

}  // namespace bridge::parallel
