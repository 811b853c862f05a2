// The cp_attention scenario of tensor_parallel_worker: context-parallel attention over the world group (cp = world
// size) against the whole sequence's causal attention computed in full on every rank.
#pragma once

namespace bridge::testing {

/// Runs every cp_comm_type (multi-head and grouped-query, fp32 and bf16, output and q/k/v gradients), the p2p ring's
/// schedule and operation count, and the a2a head-count error. Prints each failure and the worst differences seen by
/// dtype; returns the number of failures, and the worst relative difference of all in `max_relative`.
int run_context_parallel_attention_scenario(double& max_relative);

}  // namespace bridge::testing
