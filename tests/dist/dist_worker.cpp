// One rank of a multi-process test. Launched by dist_test (as torchrun would), by mpirun or by torchrun itself.
//
//   dist_worker groups <tp> <pp> [timeout_ms] [vpp]
//                                               initialise, build the parallel groups, and check every collective
//                                               on every group against values computed from the global ranks
//   dist_worker expert <tp> <pp> <ep> <etp> [cp]
//                                               the same with expert parallelism (etp 0: = tp) and context
//                                               parallelism (default 1), and that each expert or combined (dp-cp,
//                                               tp-cp, tp-dp-cp) group with an earlier group's ranks shares its object
//   dist_worker reinit                          tp=2 groups, then pp=2 groups, then a new world, in one process
//   dist_worker dead_rank [timeout_ms]          the last rank dies; every other rank must get a CommunicationError
//   dist_worker stalled_rank [timeout_ms]       the last rank lives (for 3x the timeout) but skips the collective;
//                                               the others must fail with a CommunicationError once it has passed
//   dist_worker all_to_all                      ProcessGroup::all_to_all on the world group with uneven splits (some
//                                               zero, one rank sending nothing), both ways, against values computed
//                                               from the ranks; equal splits; a group of one; bad splits' errors
//   dist_worker join <rendezvous_timeout_ms>    initialise and meet at a barrier; a failure to join prints
//                                               "rank <r>: failed after <s> s: <error>" and exits 3
//
// Exit 0 on success; failures print what differed and exit 1.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "utils/strings.h"

namespace {

using namespace bridge::parallel;

int g_failures = 0;

void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++g_failures;
  std::printf("rank %d: FAILED %s\n", get_rank(), what.c_str());
}

double value_of(int global_rank) { return global_rank + 1.0; }

// Checks every operation of `group` against the values its members' global ranks imply. Different groups run at
// the same time on different ranks, so a wrong membership or cross-talk shows up as a wrong value.
void check_group(ProcessGroup& group, const std::vector<int>& expected_members) {
  const std::string name = group.name() + "[" + bridge::utils::join(group.global_ranks(), ",") + "]";
  expect(group.global_ranks() == expected_members,
         name + " members, expected [" + bridge::utils::join(expected_members, ",") + "]");
  const auto& members = group.global_ranks();
  double sum = 0, max = 0, min = 1e9;
  for (int r : members) {
    sum += value_of(r);
    max = std::max(max, value_of(r));
    min = std::min(min, value_of(r));
  }
  const double mine = value_of(get_rank());

  torch::Tensor t = torch::full({3}, mine, torch::kFloat64);
  group.all_reduce(t, ReduceOp::kSum);
  expect(t.eq(sum).all().item<bool>(), name + " all_reduce sum " + std::to_string(t[0].item<double>()));
  t.fill_(mine);
  group.all_reduce(t, ReduceOp::kMax);
  expect(t.eq(max).all().item<bool>(), name + " all_reduce max");
  t.fill_(mine);
  group.all_reduce(t, ReduceOp::kMin);
  expect(t.eq(min).all().item<bool>(), name + " all_reduce min");

  const std::vector<torch::Tensor> gathered = group.all_gather(torch::full({2}, mine, torch::kFloat64));
  expect(static_cast<int>(gathered.size()) == group.size(), name + " all_gather size");
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    expect(gathered[i].eq(value_of(members[i])).all().item<bool>(), name + " all_gather element " + std::to_string(i));
  }

  torch::Tensor b = torch::full({4}, mine, torch::kFloat64);
  const int root = group.size() - 1;
  group.broadcast(b, root);
  expect(b.eq(value_of(members[static_cast<std::size_t>(root)])).all().item<bool>(), name + " broadcast");

  // Chunk j of every member's input is (j + 1) * value, so this rank's reduced chunk is (rank + 1) * sum.
  torch::Tensor input = torch::arange(1, group.size() + 1, torch::kFloat64).repeat_interleave(2) * mine;
  torch::Tensor chunk = group.reduce_scatter(input);
  expect(chunk.eq((group.rank() + 1) * sum).all().item<bool>(), name + " reduce_scatter");

  if (group.size() > 1) {  // a ring: even ranks send first so that no two ranks wait on each other
    const int next = (group.rank() + 1) % group.size();
    const int prev = (group.rank() - 1 + group.size()) % group.size();
    torch::Tensor out = torch::full({5}, mine, torch::kFloat64);
    torch::Tensor in = torch::zeros({5}, torch::kFloat64);
    if (group.rank() % 2 == 0) {
      group.send(out, next);
      group.recv(in, prev);
    } else {
      group.recv(in, prev);
      group.send(out, next);
    }
    expect(in.eq(value_of(members[static_cast<std::size_t>(prev)])).all().item<bool>(), name + " send/recv");

    // Non-blocking: every rank starts both directions of the ring (and an all-reduce) before waiting on any.
    torch::Tensor to_prev = torch::full({3}, mine, torch::kFloat64);
    torch::Tensor from_next = torch::zeros({3}, torch::kFloat64);
    torch::Tensor from_prev = torch::zeros({5}, torch::kFloat64);
    torch::Tensor reduced = torch::full({7}, mine, torch::kFloat64);
    const std::uint64_t before = group.operation_count();
    std::vector<Work> works;
    works.push_back(group.isend(out, next));
    works.push_back(group.isend(to_prev, prev));
    works.push_back(group.irecv(from_prev, prev));
    works.push_back(group.irecv(from_next, next));
    works.push_back(group.all_reduce_async(reduced));
    // In place, as the distributed optimizer's parameter buckets: this rank's chunk of the output is the input.
    torch::Tensor in_place = torch::full({3 * group.size()}, -1.0, torch::kFloat64);
    torch::Tensor own = in_place.narrow(0, 3 * group.rank(), 3);
    own.fill_(mine);
    works.push_back(group.all_gather_async(in_place.chunk(group.size()), own));
    wait_all(works);
    expect(group.operation_count() == before + 6, name + " operation_count counts started operations");
    for (int member = 0; member < group.size(); ++member) {
      expect(
          in_place.narrow(0, 3 * member, 3).eq(value_of(members[static_cast<std::size_t>(member)])).all().item<bool>(),
          name + " all_gather_async member " + std::to_string(member));
    }
    expect(from_prev.eq(value_of(members[static_cast<std::size_t>(prev)])).all().item<bool>(), name + " irecv prev");
    expect(from_next.eq(value_of(members[static_cast<std::size_t>(next)])).all().item<bool>(), name + " irecv next");
    expect(reduced.eq(sum).all().item<bool>(), name + " all_reduce_async");

    // Batched (Megatron's batch_isend_irecv, as the pipeline exchanges): both directions of the ring at once, equal
    // shapes, in p2p_communication's order (activation before gradient), so two ranks are each other's next and prev.
    torch::Tensor activation = torch::full({4}, mine + 0.25, torch::kFloat64);
    torch::Tensor gradient = torch::full({4}, mine + 0.5, torch::kFloat64);
    torch::Tensor activation_in = torch::zeros({4}, torch::kFloat64);
    torch::Tensor gradient_in = torch::zeros({4}, torch::kFloat64);
    const std::uint64_t before_batch = group.operation_count();
    std::vector<Work> batch = group.batch_isend_irecv({{P2POp::Kind::kRecv, activation_in, prev, 0},
                                                       {P2POp::Kind::kSend, activation, next, 0},
                                                       {P2POp::Kind::kSend, gradient, prev, 1},
                                                       {P2POp::Kind::kRecv, gradient_in, next, 1}});
    wait_all(batch);
    expect(group.operation_count() == before_batch + 4, name + " operation_count counts each op of a batch");
    expect(activation_in.eq(value_of(members[static_cast<std::size_t>(prev)]) + 0.25).all().item<bool>(),
           name + " batch_isend_irecv from prev");
    expect(gradient_in.eq(value_of(members[static_cast<std::size_t>(next)]) + 0.5).all().item<bool>(),
           name + " batch_isend_irecv from next");
  }
  group.barrier();
}

// Checks every group of the current model-parallel state.
void check_all_groups(int pp) {
  const RankLayout expected = compute_rank_layout(get_world_size(), get_rank(), get_rank_layout().options);
  std::vector<int> world(static_cast<std::size_t>(get_world_size()));
  std::iota(world.begin(), world.end(), 0);
  check_group(get_world_group(), world);
  check_group(get_tensor_model_parallel_group(), expected.tensor_model_parallel);
  check_group(get_pipeline_model_parallel_group(), expected.pipeline_model_parallel);
  check_group(get_data_parallel_group(), expected.data_parallel);
  check_group(get_model_parallel_group(), expected.model_parallel);
  check_group(get_tensor_and_data_parallel_group(), expected.tensor_and_data_parallel);
  check_group(get_context_parallel_group(), expected.context_parallel);
  check_group(get_data_parallel_group(/*with_context_parallel=*/true), expected.data_parallel_with_cp);
  check_group(get_tensor_and_context_parallel_group(), expected.tensor_and_context_parallel);
  check_group(get_tensor_and_data_parallel_group(/*with_context_parallel=*/true),
              expected.tensor_and_data_parallel_with_cp);
  expect(get_context_parallel_global_ranks() == expected.context_parallel &&
             get_context_parallel_rank() == expected.context_parallel_rank() &&
             get_context_parallel_world_size() == expected.options.context_parallel_size,
         "context-parallel ranks, rank and size");
  expect(get_data_parallel_rank() == expected.data_parallel_rank() &&
             get_data_parallel_world_size() == expected.data_parallel_size &&
             get_data_parallel_rank(/*with_context_parallel=*/true) == expected.data_parallel_rank(true) &&
             get_data_parallel_world_size(/*with_context_parallel=*/true) ==
                 expected.data_parallel_size * expected.options.context_parallel_size,
         "data-parallel rank and size, with and without cp");
  expect(get_tensor_and_context_parallel_rank() == expected.rank_in(expected.tensor_and_context_parallel) &&
             get_tensor_and_context_parallel_world_size() ==
                 expected.options.tensor_model_parallel_size * expected.options.context_parallel_size,
         "tensor-and-context-parallel rank and size");
  expect((get_embedding_group() != nullptr) == !expected.embedding.empty(), "embedding membership");
  if (ProcessGroup* embedding = get_embedding_group()) check_group(*embedding, expected.embedding);
  if (ProcessGroup* position = get_position_embedding_group()) check_group(*position, expected.position_embedding);
  check_group(get_expert_model_parallel_group(), expected.expert_model_parallel);
  check_group(get_expert_tensor_parallel_group(), expected.expert_tensor_parallel);
  check_group(get_expert_tensor_and_model_parallel_group(), expected.expert_tensor_and_model_parallel);
  check_group(get_expert_tensor_model_pipeline_parallel_group(), expected.expert_tensor_model_pipeline_parallel);
  check_group(get_expert_data_parallel_group(), expected.expert_data_parallel);
  expect(get_expert_model_parallel_rank() == expected.expert_model_parallel_rank() &&
             get_expert_model_parallel_world_size() == expected.options.expert_model_parallel_size,
         "expert model-parallel rank and size");
  expect(get_expert_tensor_parallel_rank() == expected.expert_tensor_parallel_rank() &&
             get_expert_tensor_parallel_world_size() == expert_tensor_parallel_size(expected.options),
         "expert tensor-parallel rank and size");
  expect(get_expert_data_parallel_rank() == expected.expert_data_parallel_rank() &&
             get_expert_data_parallel_world_size() == expected.expert_data_parallel_size,
         "expert data-parallel rank and size");
  const int stage = get_pipeline_model_parallel_rank();
  if (const std::optional<int> chunks = get_virtual_pipeline_model_parallel_world_size()) {
    for (int chunk = 0; chunk < *chunks; ++chunk) {  // first/last stage also mean first/last model chunk
      set_virtual_pipeline_model_parallel_rank(chunk);
      expect(is_pipeline_first_stage() == (stage == 0 && chunk == 0),
             "is_pipeline_first_stage, chunk " + std::to_string(chunk));
      expect(is_pipeline_last_stage() == (stage == pp - 1 && chunk == *chunks - 1),
             "is_pipeline_last_stage, chunk " + std::to_string(chunk));
      expect(is_pipeline_first_stage(/*ignore_virtual=*/true) == (stage == 0), "first stage ignoring chunks");
      expect(
          is_rank_in_embedding_group() == (!expected.embedding.empty() &&
                                           ((stage == 0 && chunk == 0) || (stage == pp - 1 && chunk == *chunks - 1))),
          "is_rank_in_embedding_group, chunk " + std::to_string(chunk));
    }
  } else {
    expect(is_pipeline_first_stage() == (stage == 0), "is_pipeline_first_stage");
    expect(is_pipeline_last_stage() == (stage == pp - 1), "is_pipeline_last_stage");
  }
}

void report() {
  const LaunchEnv& env = get_launch_env();
  std::printf("rank %d of %d (%s, %s store): tp %d/%d pp %d/%d dp %d/%d: %s\n", get_rank(), get_world_size(),
              std::string(to_string(env.launcher)).c_str(),
              env.use_agent_store ? "agent" : (env.is_store_server() ? "own" : "rank-0"),
              get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size(),
              get_pipeline_model_parallel_rank(), get_pipeline_model_parallel_world_size(), get_data_parallel_rank(),
              get_data_parallel_world_size(), g_failures == 0 ? "ok" : "FAILED");
}

int run_groups(int tp, int pp, std::chrono::milliseconds timeout, std::optional<int> vpp) {
  init_distributed({Backend::kGloo, timeout});
  initialize_model_parallel(tp, pp, vpp);
  check_all_groups(pp);
  report();
  destroy_distributed();  // releases the model-parallel groups too
  return g_failures == 0 ? 0 : 1;
}

// Expert and combined groups with the ranks of a group made before them share its object (no second Gloo mesh over
// the same ranks); the others are groups of their own.
void check_groups_shared() {
  std::vector<ProcessGroup*> earlier = {&get_tensor_model_parallel_group(), &get_pipeline_model_parallel_group(),
                                        &get_data_parallel_group(), &get_context_parallel_group()};
  const std::vector<ProcessGroup*> later = {&get_data_parallel_group(/*with_context_parallel=*/true),
                                            &get_model_parallel_group(),
                                            &get_tensor_and_data_parallel_group(),
                                            &get_tensor_and_context_parallel_group(),
                                            &get_tensor_and_data_parallel_group(/*with_context_parallel=*/true),
                                            &get_expert_model_parallel_group(),
                                            &get_expert_tensor_parallel_group(),
                                            &get_expert_tensor_and_model_parallel_group(),
                                            &get_expert_tensor_model_pipeline_parallel_group(),
                                            &get_expert_data_parallel_group()};
  // mp and tp-dp are always groups of their own, as tp, pp, dp and cp are.
  const std::vector<ProcessGroup*> always_new = {&get_model_parallel_group(), &get_tensor_and_data_parallel_group()};
  for (ProcessGroup* group : later) {
    const bool own = std::find(always_new.begin(), always_new.end(), group) != always_new.end();
    bool same_ranks = false, same_object = false;
    for (ProcessGroup* e : earlier) {
      same_ranks = same_ranks || e->global_ranks() == group->global_ranks();
      same_object = same_object || e == group;
    }
    if (!own) {
      expect(same_ranks == same_object, "group '" + group->name() + "' [" +
                                            bridge::utils::join(group->global_ranks(), ",") + "] " +
                                            (same_ranks ? "is a second group over an earlier group's ranks"
                                                        : "is an earlier group with other ranks"));
    }
    earlier.push_back(group);
  }
}

int run_expert(int tp, int pp, int ep, int etp, int cp) {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  ParallelOptions options;
  options.tensor_model_parallel_size = tp;
  options.pipeline_model_parallel_size = pp;
  options.expert_model_parallel_size = ep;
  options.expert_tensor_parallel_size = etp;
  options.context_parallel_size = cp;
  initialize_model_parallel(options);
  check_all_groups(pp);
  check_groups_shared();
  std::printf("rank %d of %d: cp %d/%d dp-cp %d/%d ep %d/%d etp %d/%d edp %d/%d: %s\n", get_rank(), get_world_size(),
              get_context_parallel_rank(), get_context_parallel_world_size(), get_data_parallel_rank(true),
              get_data_parallel_world_size(true), get_expert_model_parallel_rank(),
              get_expert_model_parallel_world_size(), get_expert_tensor_parallel_rank(),
              get_expert_tensor_parallel_world_size(), get_expert_data_parallel_rank(),
              get_expert_data_parallel_world_size(), g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

// Megatron's tests re-create the parallel state many times in one process; so does a user switching layouts.
int run_reinit() {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  for (const auto& [tp, pp] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 1}}) {
    initialize_model_parallel(tp, pp);
    check_all_groups(pp);
    destroy_model_parallel();
  }
  destroy_distributed();
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});  // a second world in the same process
  initialize_model_parallel(1, 1);
  check_all_groups(1);
  report();
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

// Every rank but the last runs a world all_reduce that cannot complete; returns 0 if it failed as it should.
int expect_failed_all_reduce() {
  const auto start = std::chrono::steady_clock::now();
  try {
    torch::Tensor t = torch::ones({16});
    get_world_group().all_reduce(t);
    std::printf("rank %d: all_reduce completed although a rank is missing\n", get_rank());
    return 1;
  } catch (const CommunicationError& error) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: caught after %.2f s: %s\n", get_rank(), seconds, error.what());
    return error.group() == "world" && error.operation() == "all_reduce" ? 0 : 1;
  }
}

int run_dead_rank(std::chrono::milliseconds timeout) {
  init_distributed({Backend::kGloo, timeout});
  get_world_group().barrier();
  if (get_rank() == get_world_size() - 1) {
    std::printf("rank %d: dying now\n", get_rank());
    std::fflush(stdout);
    std::_Exit(17);  // no goodbye to the peers, like a crash or an OOM kill
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int code = expect_failed_all_reduce();
  std::fflush(stdout);
  std::_Exit(code);  // the peers' connections are broken: leave without tearing groups down, as a failing job does
}

int run_stalled_rank(std::chrono::milliseconds timeout) {
  init_distributed({Backend::kGloo, timeout});
  get_world_group().barrier();
  if (get_rank() == get_world_size() - 1) {
    std::this_thread::sleep_for(timeout * 3);  // alive, connected, but never joins the collective
    std::_Exit(0);
  }
  const int code = expect_failed_all_reduce();
  std::fflush(stdout);
  std::_Exit(code);
}

// Rows rank `from` sends rank `to` in the uneven exchanges: some pairs send none.
int64_t rows_between(int from, int to) { return (2 * from + to) % 3; }

// Row k of the rows rank `from` sends rank `to`: [1000 from + 100 to + k, -(that)], in `dtype`.
torch::Tensor rows_of(int from, int to, int64_t rows, torch::Dtype dtype) {
  torch::Tensor values = torch::arange(rows, torch::kFloat64) + 1000.0 * from + 100.0 * to;
  return torch::stack({values, -values}, 1).to(dtype);
}

template <class Fn>
void expect_invalid_argument(const std::string& what, Fn&& fn, const std::vector<std::string>& words) {
  try {
    fn();
    expect(false, what + ": no exception");
  } catch (const std::invalid_argument& error) {
    for (const std::string& word : words) {
      expect(std::string(error.what()).find(word) != std::string::npos,
             what + ": '" + error.what() + "' does not name " + word);
    }
  }
}

// One uneven exchange over `group` (`count(from, to)` rows each way) and its reverse, checked against rows_of.
template <class Count>
void check_uneven_all_to_all(ProcessGroup& group, Count&& count, torch::Dtype dtype, const std::string& name) {
  const int me = group.rank(), n = group.size();
  std::vector<int64_t> input_splits, output_splits;
  std::vector<torch::Tensor> sent, expected;
  for (int peer = 0; peer < n; ++peer) {
    input_splits.push_back(count(me, peer));
    output_splits.push_back(count(peer, me));
    sent.push_back(rows_of(me, peer, count(me, peer), dtype));
    expected.push_back(rows_of(peer, me, count(peer, me), dtype));
  }
  const torch::Tensor input = torch::cat(sent);
  const torch::Tensor before = input.clone();
  const std::uint64_t operations = group.operation_count();
  const torch::Tensor output = group.all_to_all(input, output_splits, input_splits);
  expect(group.operation_count() == operations + 1, name + ": counted as one operation");
  expect(output.sizes() == torch::cat(expected).sizes() && output.equal(torch::cat(expected)),
         name + ": received [" + bridge::utils::join(output_splits, ",") + "] rows, got " + c10::str(output.sizes()));
  expect(output.scalar_type() == dtype, name + ": dtype");
  expect(input.equal(before), name + ": the input was modified");
  // The reverse exchange, splits swapped (the autograd all_to_all's backward), brings back what was sent.
  const torch::Tensor back = group.all_to_all(output, input_splits, output_splits);
  expect(back.equal(input), name + ": the reverse exchange did not bring back the input");
}

int run_all_to_all() {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  initialize_model_parallel(1, 1);
  ProcessGroup& world = get_world_group();
  const int me = world.rank(), n = world.size();

  check_uneven_all_to_all(world, rows_between, torch::kFloat64, "uneven float64");
  check_uneven_all_to_all(world, rows_between, torch::kLong, "uneven int64");
  check_uneven_all_to_all(
      world, [](int from, int to) -> int64_t { return from == 0 ? 0 : to + 1; }, torch::kFloat32,
      "rank 0 sends nothing");
  check_uneven_all_to_all(
      world, [](int, int) -> int64_t { return 0; }, torch::kFloat32, "nothing at all");

  {  // equal splits (empty vectors): chunk j of [n * 2, 3] goes to rank j, non-contiguous input
    std::vector<torch::Tensor> chunks, expected;
    for (int peer = 0; peer < n; ++peer) {
      chunks.push_back(rows_of(me, peer, 2, torch::kFloat64));
      expected.push_back(rows_of(peer, me, 2, torch::kFloat64));
    }
    const torch::Tensor input = torch::cat(chunks).t().contiguous().t();  // column-major
    const torch::Tensor output = world.all_to_all(input);
    expect(output.equal(torch::cat(expected)), "equal splits");
    expect(output.is_contiguous(), "equal splits: the output is contiguous");
  }
  {  // a group of one: a copy of the input
    ProcessGroup& tp = get_tensor_model_parallel_group();
    expect(tp.size() == 1, "tp group of one");
    const torch::Tensor input = rows_of(me, me, 3, torch::kFloat64);
    const torch::Tensor output = tp.all_to_all(input, {3}, {3});
    expect(output.equal(input) && !output.is_same(input) && output.data_ptr() != input.data_ptr(),
           "a group of one returns a copy");
    expect_invalid_argument("group of one, output rows differ", [&] { tp.all_to_all(input, {2}, {3}); },
                            {"group of one", "output_split_sizes"});
  }

  // Bad splits fail before any communication, the same on every rank, naming the group and the vector.
  const torch::Tensor rows = torch::zeros({4, 2});
  std::vector<int64_t> too_many(static_cast<std::size_t>(n + 1), 0);
  too_many[0] = 4;
  std::vector<int64_t> short_sum(static_cast<std::size_t>(n), 1), negative(static_cast<std::size_t>(n), 0);
  negative[0] = 5;
  negative[1] = -1;
  std::vector<int64_t> fine(static_cast<std::size_t>(n), 0);
  fine[0] = 4;
  expect_invalid_argument("too many input splits", [&] { world.all_to_all(rows, fine, too_many); },
                          {"all_to_all on group 'world'", "input_split_sizes", "one per member"});
  expect_invalid_argument("input splits short of the rows", [&] { world.all_to_all(rows, fine, short_sum); },
                          {"all_to_all on group 'world'", "input_split_sizes", "sum to", "dim 0 of the input has 4"});
  expect_invalid_argument("a negative split", [&] { world.all_to_all(rows, negative, fine); },
                          {"output_split_sizes[1] is -1", "must not be negative"});
  expect_invalid_argument("a scalar", [&] { world.all_to_all(torch::zeros({})); }, {"scalar"});
  expect_invalid_argument("equal splits of indivisible rows",
                          [&] {
                            world.all_to_all(torch::zeros({n + 1, 2}));
                          },
                          {"equal chunks", "split vector"});

  world.barrier();
  std::printf("rank %d of %d: all_to_all: %s\n", get_rank(), get_world_size(), g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

int run_join(std::chrono::milliseconds rendezvous_timeout) {
  DistributedOptions options;
  options.timeout = std::chrono::seconds(60);
  options.rendezvous_timeout = rendezvous_timeout;
  const auto start = std::chrono::steady_clock::now();
  try {
    init_distributed(options);
  } catch (const std::exception& error) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const char* rank = std::getenv("RANK");
    std::printf("rank %s: failed after %.2f s: %s\n", rank != nullptr ? rank : "?", seconds, error.what());
    return 3;
  }
  get_world_group().barrier();
  std::printf("rank %d of %d: join: ok\n", get_rank(), get_world_size());
  destroy_distributed();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string scenario = argc > 1 ? argv[1] : "";
    if (scenario == "groups" && argc >= 4) {
      const auto timeout = std::chrono::milliseconds(argc > 4 ? std::atoi(argv[4]) : 60000);
      const std::optional<int> vpp = argc > 5 ? std::optional<int>(std::atoi(argv[5])) : std::nullopt;
      return run_groups(std::atoi(argv[2]), std::atoi(argv[3]), timeout, vpp);
    }
    if (scenario == "expert" && argc >= 6) {
      return run_expert(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                        argc > 6 ? std::atoi(argv[6]) : 1);
    }
    if (scenario == "reinit") return run_reinit();
    if (scenario == "all_to_all") return run_all_to_all();
    if (scenario == "dead_rank") {
      return run_dead_rank(std::chrono::milliseconds(argc > 2 ? std::atoi(argv[2]) : 5000));
    }
    if (scenario == "join" && argc > 2) return run_join(std::chrono::milliseconds(std::atoi(argv[2])));
    if (scenario == "stalled_rank") {
      return run_stalled_rank(std::chrono::milliseconds(argc > 2 ? std::atoi(argv[2]) : 3000));
    }
    std::fprintf(stderr,
                 "usage: dist_worker groups <tp> <pp> [timeout_ms] | expert <tp> <pp> <ep> <etp> [cp] | "
                 "dead_rank|stalled_rank [timeout_ms]\n");
    return 2;
  } catch (const std::exception& error) {
    std::printf("error: %s\n", error.what());
    return 1;
  }
}
