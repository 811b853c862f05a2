// PyTorch Distributed Checkpoint in C++ (utils/dcp.h, utils/python_pickle.h) against PyTorch itself: a checkpoint
// bridge writes as two ranks opens with torch.distributed.checkpoint.load, one torch's dcp.save writes reads back in
// C++ (whole tensors and sub-boxes), damage is named, bad records are refused, and the pickle value tree round-trips
// through Python's own pickles. The Python side is tests/tools/dcp_reference.py run by the venv's torch.
#include "utils/dcp.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "utils/durable_file.h"
#include "utils/python_pickle.h"
#include "utils/safetensors.h"
#include "utils/torch_pickle.h"
#include "utils/zip_archive.h"

namespace bridge::utils::pickle {
// GoogleTest prints values in Python's notation when an expectation fails.
void PrintTo(const Value& value, std::ostream* out) { *out << value.repr(); }
}  // namespace bridge::utils::pickle

namespace bridge::utils {
namespace {

namespace fs = std::filesystem;
using pickle::Value;
using ::testing::HasSubstr;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("bridge_dcp_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  return out;
}

// Runs the reference script; returns its stdout, failing the test (with its stderr) when it exits non-zero.
std::string run_reference(const std::string& command, const fs::path& dir, const fs::path& expected) {
  const std::string python = BRIDGE_TOOLS_PYTHON;
  if (!fs::exists(python)) {
    ADD_FAILURE() << "the Python with torch, " << python << ", does not exist; run scripts/install_deps.sh";
    return {};
  }
  const fs::path errors = dir.parent_path() / (dir.filename().string() + "_stderr.txt");
  const std::string line = "'" + python + "' '" + BRIDGE_DCP_REFERENCE + "' " + command + " '" + dir.string() + "' '" +
                           expected.string() + "' 2>'" + errors.string() + "'";
  std::FILE* pipe = ::popen(line.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << line;
    return {};
  }
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << line << " failed (status " << status << "):\n" << read_file(errors);
    return {};
  }
  return output;
}

// torch.save([{"iteration": 7}]) as bytes: what Megatron-Core keeps in a BYTE_IO item (a list of common objects).
std::string saved_common(const fs::path& dir) {
  c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
  entry.insert("iteration", static_cast<int64_t>(7));
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(entry);
  const fs::path path = dir.parent_path() / (dir.filename().string() + "_common.pt");
  save_torch_pickle(path, list);
  return read_file(path);
}

// The tensors of the two-rank checkpoint, whole.
std::map<std::string, torch::Tensor> two_rank_tensors() {
  torch::manual_seed(1);
  return {
      {"embedding.weight", torch::randn({8, 6})},
      {"decoder.layers.weight", torch::randn({3, 4, 5})},
      {"final_norm.weight", torch::randn({6}).to(torch::kBFloat16)},
      {"step_counts", torch::arange(5, torch::kInt64) * static_cast<int64_t>(1000000007)},
      {"mask", torch::rand({3, 3}) > 0.5},
  };
}

// Writes the checkpoint as two ranks would: rank r holds rows [4r, 4r+4) of the embedding, rows [2r, 2r+2) of each
// decoder layer (chunks of size [1, 2, 5], as Megatron-Core stores layer-stacked weights), half the bf16 norm; rank 0
// the bytes item and the mask, rank 1 the int64 counts. The records travel as text, as over an all_gather.
std::vector<dcp::WriteRecord> write_two_ranks(const fs::path& dir, const std::map<std::string, torch::Tensor>& all,
                                              const std::string& common) {
  std::vector<dcp::WriteRecord> merged;
  for (int rank = 0; rank < 2; ++rank) {
    dcp::DataFileWriter writer(dir, "__" + std::to_string(rank) + "_0.distcp");
    if (rank == 0) writer.add_bytes("common", common);
    // Rank 0's rows are a view into the whole tensor's storage, rank 1's a non-contiguous copy of them.
    const torch::Tensor embedding = all.at("embedding.weight");
    const torch::Tensor rows = rank == 0 ? embedding.narrow(0, 0, 4) : embedding.t().contiguous().t().narrow(0, 4, 4);
    writer.add_tensor("embedding.weight", rows, {4 * rank, 0}, {8, 6});
    for (int64_t layer = 0; layer < 3; ++layer) {
      writer.add_tensor("decoder.layers.weight",
                        all.at("decoder.layers.weight").narrow(0, layer, 1).narrow(1, 2 * rank, 2),
                        {layer, 2 * rank, 0}, {3, 4, 5});
    }
    writer.add_tensor("final_norm.weight", all.at("final_norm.weight").narrow(0, 3 * rank, 3), {3 * rank}, {6});
    if (rank == 0) writer.add_tensor("mask", all.at("mask"), {0, 0}, {3, 3});
    if (rank == 1) writer.add_tensor("step_counts", all.at("step_counts"), {0}, {5});
    EXPECT_FALSE(fs::exists(writer.path())) << "nothing is visible before finish()";
    const std::vector<dcp::WriteRecord> records = dcp::decode_records(dcp::encode_records(writer.finish()));
    merged.insert(merged.end(), records.begin(), records.end());
  }
  dcp::write_metadata(dir, merged);
  return merged;
}

TEST(Dcp, BridgeCheckpointOpensWithTorchDistributedCheckpointLoad) {
  const fs::path dir = scratch("bridge_written");
  const std::map<std::string, torch::Tensor> all = two_rank_tensors();
  const std::vector<dcp::WriteRecord> records = write_two_ranks(dir, all, saved_common(dir));
  ASSERT_EQ(records.size(), 1U + 2 + 6 + 2 + 1 + 1);
  EXPECT_TRUE(records.front().is_bytes) << "BYTE_IO items come first in rank 0's file";
  EXPECT_EQ(records.front().location.offset, 0U);
  // Only the chunk's own bytes are stored, even for a view of the whole 8 x 6 storage.
  const std::string file = read_file(dir / "__0_0.distcp");
  for (const dcp::WriteRecord& record : records) {
    if (record.fqn != "embedding.weight" || record.location.relative_path != "__0_0.distcp") continue;
    const std::vector<ZipEntry> entries =
        read_zip_directory(std::string_view(file).substr(record.location.offset, record.location.length));
    const auto data = std::find_if(entries.begin(), entries.end(),
                                   [](const ZipEntry& entry) { return entry.name == "archive/data/0"; });
    ASSERT_NE(data, entries.end());
    EXPECT_EQ(data->size, 4U * 6 * sizeof(float));
    EXPECT_EQ(data->data_offset % 64, 0U) << "torch.save aligns storages to 64 bytes within the blob";
  }
  EXPECT_TRUE(fs::exists(dir / ".metadata"));
  EXPECT_TRUE(fs::exists(dir / "bridge_checksums.json"));
  EXPECT_FALSE(fs::exists(dir / ".metadata.tmp"));

  const fs::path expected = dir.parent_path() / "bridge_written_expected.safetensors";
  write_safetensors(expected, all);
  const std::string output = run_reference("check", dir, expected);
  ASSERT_FALSE(output.empty());
  const nlohmann::json summary = nlohmann::json::parse(output);
  EXPECT_EQ(summary.at("version"), "1.0.0");
  EXPECT_EQ(summary.at("bytes"), nlohmann::json::array({"common"}));
  const nlohmann::json& layers = summary.at("tensors").at("decoder.layers.weight");
  EXPECT_EQ(layers.at("dtype"), "float32");
  EXPECT_EQ(layers.at("size"), nlohmann::json::array({3, 4, 5}));
  EXPECT_EQ(layers.at("strides"), nlohmann::json::array({20, 5, 1}));
  // Torch parsed every chunk's offsets as written: layer l, rows 2r.
  const nlohmann::json chunks = layers.at("chunks");
  ASSERT_EQ(chunks.size(), 6U);
  EXPECT_EQ(chunks[3], nlohmann::json::parse("[[1, 2, 0], [1, 2, 5]]"));
  EXPECT_EQ(summary.at("tensors").at("final_norm.weight").at("dtype"), "bfloat16");
  EXPECT_EQ(summary.at("tensors").at("step_counts").at("dtype"), "int64");

  // And bridge reads its own checkpoint back: whole, and boxes across chunks.
  const dcp::Reader reader(dir);
  EXPECT_TRUE(reader.has_checksums());
  EXPECT_EQ(reader.byte_items(), std::vector<std::string>{"common"});
  EXPECT_EQ(reader.read_bytes("common"), saved_common(dir));
  for (const auto& [name, tensor] : all) EXPECT_TRUE(torch::equal(reader.read_whole(name), tensor)) << name;
  EXPECT_TRUE(torch::equal(reader.read("embedding.weight", {2, 1}, {4, 3}),
                           all.at("embedding.weight").slice(0, 2, 6).slice(1, 1, 4)));
  EXPECT_TRUE(torch::equal(reader.read("decoder.layers.weight", {1, 1, 2}, {2, 3, 3}),
                           all.at("decoder.layers.weight").slice(0, 1, 3).slice(1, 1, 4).slice(2, 2, 5)));
  EXPECT_EQ(reader.verify_all(), static_cast<int64_t>(records.size()));
}

TEST(Dcp, TorchSavedCheckpointReadsInCpp) {
  const fs::path dir = scratch("torch_written");
  fs::remove_all(dir);
  const fs::path expected = dir.parent_path() / "torch_written_expected.safetensors";
  const std::string output = run_reference("save", dir, expected);
  ASSERT_FALSE(output.empty());
  EXPECT_EQ(nlohmann::json::parse(output).at("bytes"), nlohmann::json::array({"extra.iteration", "note"}));

  const dcp::Reader reader(dir);
  EXPECT_FALSE(reader.has_checksums());
  const Safetensors reference = read_safetensors(expected);
  ASSERT_EQ(reader.tensors().size(), reference.tensors.size());
  for (const auto& [name, tensor] : reference.tensors) {
    ASSERT_TRUE(reader.tensors().count(name)) << name;
    const torch::Tensor read = reader.read_whole(name);
    EXPECT_EQ(read.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(read, tensor)) << name << ": " << read << " vs " << tensor;
  }
  const torch::Tensor layers = reference.tensors.at("layers.weight");
  EXPECT_TRUE(torch::equal(reader.read("layers.weight", {1, 2, 1}, {2, 3, 2}),
                           layers.slice(0, 1, 3).slice(1, 2, 5).slice(2, 1, 3)));
  EXPECT_TRUE(torch::equal(reader.read("transposed", {1, 0}, {3, 2}),
                           reference.tensors.at("transposed").slice(0, 1, 4).slice(1, 0, 2)));
  EXPECT_EQ(reader.byte_items(), (std::vector<std::string>{"extra.iteration", "note"}));
  // A bytes item is torch.save's bytes: LibTorch's loader reads the str back.
  const fs::path note = dir.parent_path() / "torch_written_note.pt";
  write_file_durably(note, reader.read_bytes("note"));
  EXPECT_EQ(load_torch_pickle(note).toStringRef(), "hello");
  EXPECT_EQ(reader.verify_all(), static_cast<int64_t>(reference.tensors.size()));

  EXPECT_THAT(
      [&] {
        reader.read("layers.weigth", {0, 0, 0}, {1, 1, 1});
      },
      ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("did you mean 'layers.weight'")));
  EXPECT_THAT(
      [&] {
        reader.read("layers.weight", {2, 0, 0}, {2, 1, 1});
      },
      ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("outside its shape [3, 5, 4]")));
}

// Megatron-Core's .metadata differs from torch's: an extra all_local_plans (SavePlans of WriteItems, the item type an
// enum), a StorageMeta with a str checkpoint_id, and (older Pythons) the memory-format enum as
// _MEM_FORMAT_ENCODING((0,)) in a 5-tuple TensorProperties. Both bridge's reader and torch's must take it.
TEST(Dcp, ReadsMegatronCoreStyleMetadata) {
  const fs::path dir = scratch("mc_style");
  const std::map<std::string, torch::Tensor> all = two_rank_tensors();
  write_two_ranks(dir, all, saved_common(dir));
  Value metadata = pickle::loads(read_file(dir / ".metadata"));
  const std::string module = "torch.distributed.checkpoint.metadata";
  const std::string planner = "torch.distributed.checkpoint.planner";
  for (auto& [fqn, item] : metadata.object().state->dict().items.at(0).second.dict().items) {
    if (!item.object().is(module, "TensorStorageMetadata")) continue;
    pickle::Object& properties = item.object().state->dict().items.at(0).second.object();
    std::vector<Value> five = properties.state->tuple_items();
    five.pop_back();
    five[3] = pickle::reduce({module, "_MEM_FORMAT_ENCODING"}, {0});
    properties.state = Value::tuple(std::move(five));
  }
  const Value write_item = pickle::new_object(
      {planner, "WriteItem"},
      Value::dict(
          {{"index", pickle::new_object({module, "MetadataIndex"}, Value::dict({{"fqn", "mask"}}))},
           {"type", pickle::reduce({"builtins", "getattr"}, {pickle::Global{planner, "WriteItemType"}, "SHARD"})},
           {"tensor_data", Value()}}));
  const Value plan = pickle::new_object({planner, "SavePlan"}, Value::dict({{"items", Value::list({write_item})},
                                                                            {"storage_data", Value()},
                                                                            {"planner_data", Value()},
                                                                            {"usable", true}}));
  for (auto& [key, value] : metadata.object().state->dict().items) {
    if (key.as_str() == "storage_meta") {
      value = pickle::new_object({module, "StorageMeta"}, Value::dict({{"checkpoint_id", dir.string()},
                                                                       {"save_id", "0f2c"},
                                                                       {"load_id", Value()},
                                                                       {"modules", Value::list({})}}));
    }
  }
  metadata.object().state->dict().items.emplace_back("all_local_plans", Value::list({plan, plan}));
  write_file_durably(dir / ".metadata", pickle::dumps(metadata));

  const dcp::Reader reader(dir);
  for (const auto& [name, tensor] : all) EXPECT_TRUE(torch::equal(reader.read_whole(name), tensor)) << name;
  EXPECT_EQ(reader.tensors().at("final_norm.weight").dtype, c10::ScalarType::BFloat16);
  const fs::path expected = dir.parent_path() / "mc_style_expected.safetensors";
  write_safetensors(expected, all);
  EXPECT_FALSE(run_reference("check", dir, expected).empty()) << "torch's own loader reads it too";
}

// Figures: a 64 MB float32 tensor in two row chunks, written by two writers and read whole and by a box.
TEST(Dcp, SixtyFourMegabytesRoundTrip) {
  const fs::path dir = scratch("large");
  const torch::Tensor whole = torch::randn({4096, 4096});
  std::vector<dcp::WriteRecord> records;
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < 2; ++rank) {
    dcp::DataFileWriter writer(dir, "__" + std::to_string(rank) + "_0.distcp");
    writer.add_tensor("w", whole.narrow(0, 2048 * rank, 2048), {2048 * rank, 0}, {4096, 4096});
    const std::vector<dcp::WriteRecord> mine = writer.finish();
    records.insert(records.end(), mine.begin(), mine.end());
  }
  dcp::write_metadata(dir, records);
  const auto written = std::chrono::steady_clock::now();
  const dcp::Reader reader(dir);
  const torch::Tensor back = reader.read_whole("w");
  const auto read = std::chrono::steady_clock::now();
  EXPECT_TRUE(torch::equal(back, whole));
  EXPECT_TRUE(torch::equal(reader.read("w", {2000, 100}, {100, 50}), whole.slice(0, 2000, 2100).slice(1, 100, 150)));
  const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::cout << "64 MB: written (2 files, fsync) in " << ms(start, written) << " ms, read whole (checksums verified) in "
            << ms(written, read) << " ms\n";
}

// The byte offset of tensor `fqn`'s first chunk in `file`, plus `into` bytes.
uint64_t blob_offset(const std::vector<dcp::WriteRecord>& records, const std::string& fqn, const std::string& file,
                     uint64_t into) {
  for (const dcp::WriteRecord& record : records) {
    if (record.fqn == fqn && record.location.relative_path == file) return record.location.offset + into;
  }
  ADD_FAILURE() << "no record of " << fqn << " in " << file;
  return 0;
}

void flip_byte(const fs::path& path, uint64_t offset) {
  std::string bytes = read_file(path);
  bytes.at(offset) = static_cast<char>(bytes.at(offset) ^ 0x40);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(Dcp, FlippedByteInABlobIsNamed) {
  const fs::path dir = scratch("damaged");
  const std::map<std::string, torch::Tensor> all = two_rank_tensors();
  const std::vector<dcp::WriteRecord> records = write_two_ranks(dir, all, saved_common(dir));
  // A byte of rank 1's embedding rows, past the zip's headers: its tensor data.
  const dcp::WriteRecord* rows = nullptr;
  for (const dcp::WriteRecord& record : records) {
    if (record.fqn == "embedding.weight" && record.location.relative_path == "__1_0.distcp") rows = &record;
  }
  ASSERT_NE(rows, nullptr);
  const std::string blob = read_file(dir / "__1_0.distcp").substr(rows->location.offset, rows->location.length);
  uint64_t data_offset = 0;
  for (const ZipEntry& entry : read_zip_directory(blob)) {
    if (entry.name.find("data/0") != std::string::npos) data_offset = entry.data_offset;
  }
  ASSERT_GT(data_offset, 0U);
  flip_byte(dir / "__1_0.distcp", rows->location.offset + data_offset + 5);

  const dcp::Reader reader(dir);
  EXPECT_THAT(
      [&] {
        reader.read("embedding.weight", {3, 0}, {2, 6});
      },
      ::testing::ThrowsMessage<DamagedFileError>(
          ::testing::AllOf(HasSubstr("__1_0.distcp"), HasSubstr("'embedding.weight'"), HasSubstr("offsets [4, 0]"))));
  // Rank 0's rows do not touch the damaged chunk: only overlapping chunks are read.
  EXPECT_TRUE(torch::equal(reader.read("embedding.weight", {0, 0}, {4, 6}), all.at("embedding.weight").slice(0, 0, 4)));
  EXPECT_THROW(reader.verify_all(), DamagedFileError);

  // Without bridge's checksum file (as torch writes checkpoints), the blob's own zip CRC32s still find it.
  fs::remove(dir / "bridge_checksums.json");
  const dcp::Reader plain(dir);
  EXPECT_FALSE(plain.has_checksums());
  EXPECT_THAT([&] { plain.read_whole("embedding.weight"); },
              ::testing::ThrowsMessage<DamagedFileError>(
                  ::testing::AllOf(HasSubstr("__1_0.distcp"), HasSubstr("'embedding.weight'"))));

  // A blob whose zip structure is broken (its first bytes) is damage too, named the same way.
  flip_byte(dir / "__0_0.distcp", blob_offset(records, "mask", "__0_0.distcp", 1));
  EXPECT_THAT([&] { plain.read_whole("mask"); }, ::testing::ThrowsMessage<DamagedFileError>(
                                                     ::testing::AllOf(HasSubstr("__0_0.distcp"), HasSubstr("'mask'"))));
}

TEST(Dcp, MissingMetadataIsAClearError) {
  const fs::path dir = scratch("no_metadata");
  EXPECT_THAT([&] { dcp::Reader reader(dir); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  ::testing::AllOf(HasSubstr(".metadata"), HasSubstr("not a PyTorch Distributed Checkpoint"))));
  write_file_durably(dir / ".metadata", "not a pickle");
  EXPECT_THAT([&] { dcp::Reader reader(dir); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("cannot read " + (dir / ".metadata").string())));
}

TEST(Dcp, RecordsThatOverlapOrLeaveAHoleAreRefused) {
  const fs::path source = scratch("records");
  const std::vector<dcp::WriteRecord> good = write_two_ranks(source, two_rank_tensors(), "bytes");
  const auto refused = [&](std::vector<dcp::WriteRecord> records, const std::string& name) {
    const fs::path dir = scratch(name);
    EXPECT_THAT([&] { dcp::write_metadata(dir, records); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("'decoder.layers.weight'")))
        << name;
    EXPECT_FALSE(fs::exists(dir / ".metadata")) << name;
    EXPECT_FALSE(fs::exists(dir / "bridge_checksums.json")) << name;
  };
  std::vector<dcp::WriteRecord> overlap = good;
  std::vector<dcp::WriteRecord> hole;
  for (dcp::WriteRecord& record : overlap) {
    if (record.fqn == "decoder.layers.weight" && record.offsets == std::vector<int64_t>{1, 2, 0}) record.offsets[1] = 1;
  }
  for (const dcp::WriteRecord& record : good) {
    if (!(record.fqn == "decoder.layers.weight" && record.offsets == std::vector<int64_t>{2, 0, 0}))
      hole.push_back(record);
  }
  refused(overlap, "overlap");
  refused(hole, "hole");
  std::vector<dcp::WriteRecord> shape = good;
  shape.back().fqn = "decoder.layers.weight";  // the int64 counts joining a float tensor
  refused(shape, "dtype");
  std::vector<dcp::WriteRecord> twice = good;
  twice.push_back(good.front());
  const fs::path dir = scratch("bytes_twice");
  EXPECT_THAT([&] { dcp::write_metadata(dir, twice); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("the bytes item 'common' is written twice")));
}

TEST(Dcp, RecordsRoundTripAsText) {
  dcp::WriteRecord tensor;
  tensor.fqn = "layers.0.weight é";
  tensor.offsets = {1, 0, 4294967296LL};
  tensor.sizes = {1, 2, 3};
  tensor.global_shape = {3, 2, 8589934592LL};
  tensor.dtype = c10::ScalarType::BFloat16;
  tensor.location = {"__7_0.distcp", 18446744073709551557ULL, 12345};
  tensor.checksum = 0xdeadbeef;
  dcp::WriteRecord bytes;
  bytes.fqn = "common";
  bytes.is_bytes = true;
  bytes.location = {"__0_0.distcp", 0, 99};
  const std::vector<dcp::WriteRecord> back = dcp::decode_records(dcp::encode_records({tensor, bytes}));
  ASSERT_EQ(back.size(), 2U);
  EXPECT_EQ(back[0].fqn, tensor.fqn);
  EXPECT_EQ(back[0].offsets, tensor.offsets);
  EXPECT_EQ(back[0].sizes, tensor.sizes);
  EXPECT_EQ(back[0].global_shape, tensor.global_shape);
  EXPECT_EQ(back[0].dtype, tensor.dtype);
  EXPECT_EQ(back[0].location.relative_path, tensor.location.relative_path);
  EXPECT_EQ(back[0].location.offset, tensor.location.offset);
  EXPECT_EQ(back[0].location.length, tensor.location.length);
  EXPECT_EQ(back[0].checksum, tensor.checksum);
  EXPECT_TRUE(back[1].is_bytes);
  EXPECT_EQ(back[1].location.length, 99U);
  EXPECT_THROW(dcp::decode_records("[{\"fqn\": 1}]"), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------------------
// The pickle value tree

Value sample() {
  return Value::dict({
      {"a", Value::list({1, -2, 3.5, Value(), true})},
      {"b", Value::tuple({pickle::Bytes{"xy"}, "\xc3\xa9", int64_t{1} << 40, INT64_MIN, INT64_MAX})},
      {"c", Value::dict({{"d", "\xc3\xa9\xc3\xa9\xc3\xa9"}})},
      {7, -129},
  });
}

TEST(PythonPickle, ReadsPythonsOwnPickles) {
  // pickle.dumps(<sample>, protocol=p) by CPython 3.11.
  const Value protocol4 = pickle::loads(from_hex(
      "80049567000000000000007d94288c0161945d94284b014afeffffff47400c0000000000004e88658c0162942843027879948c02c3a994"
      "8a060000000000018a0800000000000000808a08ffffffffffffff7f74948c0163947d948c0164948c06c3a9c3a9c3a994734b074a7fff"
      "ffff752e"));
  EXPECT_EQ(protocol4, sample()) << protocol4.repr();
  // Protocol 2 has no bytes opcode: Python writes b'xy' as _codecs.encode('xy', 'latin1').
  const Value protocol2 = pickle::loads(from_hex(
      "80027d71002858010000006171015d7102284b014afeffffff47400c0000000000004e8865580100000062710328635f636f646563730a"
      "656e636f64650a710458020000007879710558060000006c6174696e3171068671075271085802000000c3a971098a060000000000018a"
      "0800000000000000808a08ffffffffffffff7f74710a580100000063710b7d710c580100000064710d5806000000c3a9c3a9c3a9710e73"
      "4b074a7fffffff752e"));
  const Value& encoded = protocol2.dict().find("b")->tuple_items()[0];
  EXPECT_EQ(encoded, pickle::reduce(pickle::Global{"_codecs", "encode"}, {"xy", "latin1"}));
  EXPECT_EQ(*protocol2.dict().find("a"), *sample().dict().find("a"));
  // Protocol 0: text opcodes, PUT/GET by decimal index.
  const Value protocol0 = pickle::loads(from_hex(
      "286470300a56610a70310a286c70320a49310a61492d320a6146332e350a614e614930310a617356620a70330a28635f636f646563730a"
      "656e636f64650a70340a285678790a70350a566c6174696e310a70360a7470370a5270380a56e90a70390a4c3130393935313136323737"
      "37364c0a4c2d393232333337323033363835343737353830384c0a4c393232333337323033363835343737353830374c0a747031300a73"
      "56630a7031310a28647031320a56640a7031330a56e9e9e90a7031340a737349370a492d3132390a732e"));
  EXPECT_EQ(*protocol0.dict().find("a"), *sample().dict().find("a"));
  EXPECT_EQ(protocol0.dict().find("b")->tuple_items()[3].as_int(), INT64_MIN);
}

TEST(PythonPickle, DumpsRoundTrips) {
  EXPECT_EQ(pickle::loads(pickle::dumps(sample())), sample());
  // Every integer width the writer picks between, at its edges.
  for (const int64_t n : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{65535}, int64_t{65536}, int64_t{-1},
                          int64_t{-128}, int64_t{-129}, int64_t{INT32_MIN}, int64_t{INT32_MAX} + 1, INT64_MIN,
                          INT64_MAX, int64_t{1} << 55, -(int64_t{1} << 55)}) {
    EXPECT_EQ(pickle::loads(pickle::dumps(n)).as_int(), n);
  }
  // Objects as DCP pickles them: NEWOBJ + BUILD, REDUCE, NEWOBJ_EX, a persistent id; long strings and bytes.
  auto with_kwargs = std::make_shared<pickle::Object>();
  with_kwargs->type = {"mod", "Cls"};
  with_kwargs->args = {1};
  with_kwargs->kwargs = {{"k", "v"}};
  auto persistent = std::make_shared<pickle::Object>();
  persistent->made = pickle::Object::Made::kPersistentId;
  persistent->args = {Value::tuple({"storage", pickle::Global{"torch", "FloatStorage"}, "0", "cpu", 4})};
  const Value objects = Value::list({
      pickle::new_object({"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
                         Value::dict({{"offsets", pickle::reduce({"torch", "Size"}, {Value::tuple({0, 4})})}})),
      pickle::new_object({"m", "Empty"}, std::nullopt),
      Value(with_kwargs),
      Value(persistent),
      std::string(70000, 'x'),
      pickle::Bytes{std::string(300, '\0')},
      Value::tuple({1, 2, 3, 4, 5}),
      pickle::Global{"torch", "bfloat16"},
  });
  const std::string bytes = pickle::dumps(objects);
  EXPECT_EQ(pickle::loads(bytes), objects);
  // Globals and strings are memoized: the second reference is a BINGET, not the text again.
  const Value twice = Value::list({pickle::Global{"torch", "Size"}, pickle::Global{"torch", "Size"}, "fqn", "fqn"});
  const std::string memoized = pickle::dumps(twice);
  EXPECT_EQ(memoized.find("Size"), memoized.rfind("Size"));
  EXPECT_EQ(pickle::loads(memoized), twice);
}

TEST(PythonPickle, DamagedPicklesAreRefusedWithTheOffset) {
  const std::string good = pickle::dumps(sample());
  EXPECT_THAT([&] { pickle::loads(good.substr(0, good.size() - 1)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("without a STOP")));
  EXPECT_THAT(
      [&] {
        pickle::loads(
            std::string("\x80\x04\x8c\xff"
                        "ab",
                        6));
      },
      ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("at byte 2: needs 255 bytes, but 2 remain")));
  EXPECT_THAT([&] { pickle::loads(std::string("\x80\x04h\x05.", 5)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("memo entry 5 was never stored")));
  EXPECT_THAT(
      [&] {
        pickle::loads(
            std::string("\x80\x04"
                        "a.",
                        4));
      },
      ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("stack is empty")));
  EXPECT_THAT([&] { sample().as_int(); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("expected an int, got dict")));
}

TEST(PythonPickle, MetadataPickleNamesTorchsClasses) {
  dcp::WriteRecord record;
  record.fqn = "w";
  record.sizes = {2};
  record.offsets = {0};
  record.global_shape = {2};
  record.location = {"__0_0.distcp", 0, 10};
  const Value metadata = pickle::loads(dcp::metadata_pickle({record}));
  const pickle::Object& root = metadata.object();
  EXPECT_TRUE(root.is("torch.distributed.checkpoint.metadata", "Metadata"));
  EXPECT_EQ(*root.attribute("version"), Value("1.0.0"));
  const pickle::Object& info = root.attribute("state_dict_metadata")->dict().find("w")->object();
  const auto& properties = info.attribute("properties")->object().state->tuple_items();
  ASSERT_EQ(properties.size(), 6U);
  EXPECT_EQ(properties[0], Value(pickle::Global{"torch", "float32"}));
  EXPECT_EQ(properties[3],
            pickle::reduce({"builtins", "getattr"},
                           {pickle::Global{"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"},
                            "TORCH_CONTIGUOUS_FORMAT"}));
  const auto& [index, location] = root.attribute("storage_data")->dict().items.at(0);
  EXPECT_EQ(*index.object().attribute("offset"), pickle::reduce({"torch", "Size"}, {Value::tuple({0})}));
  EXPECT_EQ(*location.object().attribute("length"), Value(10));
}

}  // namespace
}  // namespace bridge::utils
