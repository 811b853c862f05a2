// The size limit of a Hugging Face directory's weight files (transformers' save_pretrained(max_shard_size=...)):
// its default here and its text form, "5GB" as transformers writes it.
#pragma once

#include <cstdint>
#include <string>

namespace bridge::hf {

/// 5 GB, the shards real checkpoints come in (Llama-3-8B: four files) and transformers 4.x's default; 5.x's is
/// 50 GB. One model.safetensors below it.
inline constexpr int64_t kMaxShardBytes = 5'000'000'000;

/// Bytes of "5GB", "500MB", "200KB" (powers of 1000), "2GiB", "64MiB", "4KiB" (powers of 1024) or "123456"; units in
/// any case. std::invalid_argument for anything else or a size that is not positive.
int64_t parse_shard_size(const std::string& text);

}  // namespace bridge::hf
