// checkpoint.also_save_hf_checkpoint (Megatron-Bridge's): beside each committed checkpoint, <save>/iter_N/hf/ as
// AutoModelForCausalLM.from_pretrained loads it (config.json, the safetensors, generation_config.json and the run's
// tokenizer files), the same directory bridge-export writes from that checkpoint. Megatron-Bridge writes it on the
// training thread; here one rank writes it on a background thread from the committed checkpoint's files, so the
// training step never waits for it and no rank gathers the model onto the training thread. The next save (and the end
// of the run) waits for it, and its failure fails the run there on every rank (save_checkpoint, checkpointing.cpp).
//
//   <save>/iter_0000020/hf.partial/   being written (a killed write leaves it; the next save removes it)
//   <save>/iter_0000020/hf/           renamed from hf.partial once every file is written: whole or absent
#pragma once

#include <filesystem>
#include <future>

namespace bridge::training {

inline constexpr char kHfCheckpointDirectory[] = "hf";
inline constexpr char kHfCheckpointStaging[] = "hf.partial";

/// Writes <iteration_directory>/hf from the committed checkpoint in it (either format, any layout) as bridge-export
/// writes it, through hf.partial, replacing an earlier hf/. Throws std::runtime_error saying what failed and how to
/// write it again.
void write_hf_checkpoint(const std::filesystem::path& iteration_directory);

/// The rank that writes: the world's last (rank 0 already commits the checkpoint and writes the tracker).
int hf_checkpoint_writer_rank(int world_size);

/// One rank's part of writing an iteration's hf/: on the writer, write_hf_checkpoint on a background thread; nothing
/// on the other ranks. Destroying it waits for the thread, so an error in training leaves none behind.
class HfCheckpointWrite {
 public:
  HfCheckpointWrite(std::filesystem::path iteration_directory, bool writer);
  HfCheckpointWrite(const HfCheckpointWrite&) = delete;
  HfCheckpointWrite& operator=(const HfCheckpointWrite&) = delete;
  ~HfCheckpointWrite();

  /// Whether this rank's part is over (at once on a rank that does not write).
  bool done() const;
  /// Waits for this rank's part; rethrows its failure.
  void wait();
  const std::filesystem::path& iteration_directory() const { return iteration_directory_; }

 private:
  std::filesystem::path iteration_directory_;
  std::future<void> written_;
};

/// Removes a hf.partial that a killed write left in `iteration_directory`; true when there was one.
bool remove_interrupted_hf_write(const std::filesystem::path& iteration_directory);

}  // namespace bridge::training
