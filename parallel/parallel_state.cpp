// parallel_state: the process-wide groups of this rank, created in one fixed order on every rank so that no two
// ranks wait on each other's groups. An expert group with the same ranks as a group already made shares it.
#include "parallel/parallel_state.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel/distributed.h"
#include "utils/strings.h"

namespace bridge::parallel {
namespace {

struct State {
  RankLayout layout;
  std::shared_ptr<ProcessGroup> tensor, pipeline, data, data_with_cp, context, model, tensor_and_data,
      tensor_and_context, tensor_and_data_with_cp, embedding, position_embedding;
  std::shared_ptr<ProcessGroup> expert_model, expert_tensor, expert_tensor_and_model, expert_tensor_model_pipeline,
      expert_data;
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

using GroupField = std::vector<int> RankLayout::*;

// Makes groups that may repeat one already made (cp 1 makes dp-cp = dp, tp-cp = tp and tp-dp-cp = tp-dp; ep 1 with
// expert tp = tp repeats every dense group; ep = tp with expert tp 1 makes ep = tp and expert dp = dp), sharing it
// instead of opening a second Gloo mesh over the same ranks.
// Members must create common groups in the same order, so whether two kinds coincide is read from rank 0's layout,
// which every rank computes alike: every rank then calls new_group for the same kinds. The groups are masked
// orthogonal, each kind tiling the world with shifted copies of one rank pattern; when rank 0's groups of two kinds
// are equal, so is the pattern and hence every rank's pair, which make() checks.
class GroupReuse {
 public:
  GroupReuse(const RankLayout& mine, const RankLayout& rank0) : mine_(mine), rank0_(rank0) {}

  /// Offers `group`, made for `field`, for reuse.
  void add(GroupField field, std::shared_ptr<ProcessGroup> group) { made_.emplace_back(field, std::move(group)); }

  /// The group of `field`: one already made for the same ranks, or a new one named `name`.
  std::shared_ptr<ProcessGroup> make(const std::string& name, GroupField field) {
    for (const auto& [made_field, group] : made_) {
      if (rank0_.*made_field != rank0_.*field) continue;
      if (mine_.*made_field != mine_.*field) {
        throw std::logic_error("initialize_model_parallel: group '" + name + "' of rank " + std::to_string(mine_.rank) +
                               " is [" + utils::join(mine_.*field, ", ") + "], not the group [" +
                               utils::join(mine_.*made_field, ", ") +
                               "] it shares on rank 0; the ranks would create different groups");
      }
      return group;
    }
    std::shared_ptr<ProcessGroup> group = new_group(name, mine_.*field);
    add(field, group);
    return group;
  }

 private:
  const RankLayout& mine_;
  const RankLayout& rank0_;
  std::vector<std::pair<GroupField, std::shared_ptr<ProcessGroup>>> made_;
};

}  // namespace

void initialize_model_parallel(const ParallelOptions& options) {
  if (state()) throw std::logic_error("initialize_model_parallel: already initialised; call destroy_model_parallel()");
  if (!is_distributed_initialized()) {
    throw std::logic_error("initialize_model_parallel: call bridge::parallel::init_distributed() first");
  }
  auto s = std::make_unique<State>();
  s->layout = compute_rank_layout(get_world_size(), get_rank(), options);
  const RankLayout& l = s->layout;
  // Every rank is in exactly one group of each kind, and all ranks go through the kinds in this order. With cp > 1 the
  // combined kinds share a group made before them where their ranks coincide (dp 1: dp-cp is cp; tp 1: tp-cp is cp),
  // which is read from rank 0's layout (see GroupReuse), the same on every rank.
  const RankLayout rank0 = compute_rank_layout(l.world_size, 0, options);
  GroupReuse reuse(l, rank0);
  const auto make_new = [&](const std::string& name, GroupField field) {
    std::shared_ptr<ProcessGroup> group = new_group(name, l.*field);
    reuse.add(field, group);
    return group;
  };
  s->tensor = make_new("tp", &RankLayout::tensor_model_parallel);
  s->pipeline = make_new("pp", &RankLayout::pipeline_model_parallel);
  s->data = make_new("dp", &RankLayout::data_parallel);
  s->context = make_new("cp", &RankLayout::context_parallel);
  // Without context parallelism each combined kind is its cp-less group itself, as before there were cp groups (not
  // merely one with the same ranks, such as another group of one in a single process).
  const bool cp = options.context_parallel_size > 1;
  s->data_with_cp = cp ? reuse.make("dp-cp", &RankLayout::data_parallel_with_cp) : s->data;
  s->model = make_new("mp", &RankLayout::model_parallel);
  s->tensor_and_data = make_new("tp-dp", &RankLayout::tensor_and_data_parallel);
  s->tensor_and_context = cp ? reuse.make("tp-cp", &RankLayout::tensor_and_context_parallel) : s->tensor;
  s->tensor_and_data_with_cp =
      cp ? reuse.make("tp-dp-cp", &RankLayout::tensor_and_data_parallel_with_cp) : s->tensor_and_data;
  if (!l.embedding.empty()) s->embedding = new_group("embd", l.embedding);
  if (!l.position_embedding.empty()) s->position_embedding = new_group("pos-embd", l.position_embedding);
  // The expert generator's groups, in this order on every rank. A shared group keeps its first name in errors.
  s->expert_model = reuse.make("ep", &RankLayout::expert_model_parallel);
  s->expert_tensor = reuse.make("etp", &RankLayout::expert_tensor_parallel);
  s->expert_tensor_and_model = reuse.make("tp-ep", &RankLayout::expert_tensor_and_model_parallel);
  s->expert_tensor_model_pipeline = reuse.make("tp-ep-pp", &RankLayout::expert_tensor_model_pipeline_parallel);
  s->expert_data = reuse.make("edp", &RankLayout::expert_data_parallel);
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
int get_data_parallel_rank(bool with_context_parallel) { return get_data_parallel_group(with_context_parallel).rank(); }
int get_data_parallel_world_size(bool with_context_parallel) {
  return get_data_parallel_group(with_context_parallel).size();
}

ProcessGroup& get_context_parallel_group() { return *require_state("get_context_parallel_group").context; }
const std::vector<int>& get_context_parallel_global_ranks() { return get_context_parallel_group().global_ranks(); }
int get_context_parallel_rank() { return get_context_parallel_group().rank(); }
int get_context_parallel_world_size() { return get_context_parallel_group().size(); }

ProcessGroup& get_model_parallel_group() { return *require_state("get_model_parallel_group").model; }
ProcessGroup& get_tensor_and_data_parallel_group(bool with_context_parallel) {
  State& s = require_state("get_tensor_and_data_parallel_group");
  return with_context_parallel ? *s.tensor_and_data_with_cp : *s.tensor_and_data;
}
ProcessGroup& get_tensor_and_context_parallel_group() {
  return *require_state("get_tensor_and_context_parallel_group").tensor_and_context;
}
int get_tensor_and_context_parallel_rank() { return get_tensor_and_context_parallel_group().rank(); }
int get_tensor_and_context_parallel_world_size() { return get_tensor_and_context_parallel_group().size(); }

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

ProcessGroup& get_expert_model_parallel_group() {
  return *require_state("get_expert_model_parallel_group").expert_model;
}
int get_expert_model_parallel_rank() { return get_expert_model_parallel_group().rank(); }
int get_expert_model_parallel_world_size() { return get_expert_model_parallel_group().size(); }

ProcessGroup& get_expert_tensor_parallel_group() {
  return *require_state("get_expert_tensor_parallel_group").expert_tensor;
}
int get_expert_tensor_parallel_rank() { return get_expert_tensor_parallel_group().rank(); }
int get_expert_tensor_parallel_world_size() { return get_expert_tensor_parallel_group().size(); }

ProcessGroup& get_expert_tensor_and_model_parallel_group() {
  return *require_state("get_expert_tensor_and_model_parallel_group").expert_tensor_and_model;
}
ProcessGroup& get_expert_tensor_model_pipeline_parallel_group() {
  return *require_state("get_expert_tensor_model_pipeline_parallel_group").expert_tensor_model_pipeline;
}

ProcessGroup& get_expert_data_parallel_group() { return *require_state("get_expert_data_parallel_group").expert_data; }
int get_expert_data_parallel_rank() { return get_expert_data_parallel_group().rank(); }
int get_expert_data_parallel_world_size() { return get_expert_data_parallel_group().size(); }

}  // namespace bridge::parallel
