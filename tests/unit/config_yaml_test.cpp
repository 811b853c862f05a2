// YAML configs and overrides: parsing over the defaults, every value type, the errors users meet (unknown keys with a
// suggestion, wrong types, bad YAML with its line), the keys a command line sets (~key unsets), an hf:<dir> start's
// model over a recipe's, the round trip through to_yaml, the key reference, the shipped recipes, and a check that the
// key table covers every field the config headers declare.
#include "training/config/config_yaml.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tests/unit/config_test_support.h"
#include "training/callbacks/registry.h"
#include "training/config/hf_start.h"

namespace bridge::training {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kSourceDir = BRIDGE_SOURCE_DIR;

using testing::config_error;
using testing::override_error;

TEST(ConfigYaml, NestedSectionsAndDottedKeysApplyOverTheDefaults) {
  const ConfigContainer config = load_config_yaml_string(R"(
model:
  num_layers: 6
  hidden_dropout: 0.0
train.global_batch_size: 32
optimizer: {lr: 3.0e-4, optimizer: sgd}
dataset:
  data_path: [/data/a_text_document, "/data/b c_text_document"]
parallelism:
  virtual_pipeline_model_parallel_size: 2
  timeout: 90s
checkpoint:   # every key commented out
)");
  const ConfigContainer defaults;
  EXPECT_EQ(config.model.num_layers, 6);
  EXPECT_EQ(config.model.hidden_dropout, 0.0);
  EXPECT_EQ(config.train.global_batch_size, 32);
  EXPECT_EQ(config.optimizer.lr, 3e-4);
  EXPECT_EQ(config.optimizer.optimizer, "sgd");
  EXPECT_EQ(config.dataset.data_path, (std::vector<std::string>{"/data/a_text_document", "/data/b c_text_document"}));
  EXPECT_EQ(config.parallelism.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(config.parallelism.timeout, std::chrono::seconds(90));
  // Untouched keys keep their defaults.
  EXPECT_EQ(config.model.hidden_size, defaults.model.hidden_size);
  EXPECT_EQ(config.train.micro_batch_size, defaults.train.micro_batch_size);
  EXPECT_EQ(config.checkpoint.save, defaults.checkpoint.save);
  EXPECT_EQ(config.rng.seed, defaults.rng.seed);
}

TEST(ConfigYaml, EmptyTextGivesTheDefaults) {
  EXPECT_EQ(to_yaml(load_config_yaml_string("")), to_yaml(ConfigContainer{}));
  EXPECT_EQ(to_yaml(load_config_yaml_string("# only a comment\n")), to_yaml(ConfigContainer{}));
}

TEST(ConfigYaml, OverridesSetEveryKindOfValue) {
  ConfigContainer config;
  apply_override(config, "train.train_iters=500");
  apply_override(config, "optimizer.lr=-1.5e-3");  // validate() rejects it later; the type is right
  apply_override(config, "model.share_embeddings_and_output_weights=false");
  apply_override(config, "ddp.overlap_grad_reduce=no");
  apply_override(config, "dataset.data_path=[a, b]");
  apply_override(config, "checkpoint.save=/tmp/run 1");
  apply_override(config, "parallelism.virtual_pipeline_model_parallel_size=4");
  apply_override(config, "parallelism.microbatch_group_size_per_vp_stage=8");
  apply_override(config, "parallelism.timeout=1.5min");
  apply_override(config, "parallelism.backend=NCCL");
  apply_override(config, "parallelism.device=cuda:1");
  apply_override(config, "rng.seed=18446744073709551615");
  apply_override(config, "model={num_layers: 3, hidden_size: 48}");  // a section as a whole
  EXPECT_EQ(config.train.train_iters, 500);
  EXPECT_EQ(config.optimizer.lr, -1.5e-3);
  EXPECT_FALSE(config.model.share_embeddings_and_output_weights);
  EXPECT_FALSE(config.ddp.overlap_grad_reduce);
  EXPECT_EQ(config.dataset.data_path, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(config.checkpoint.save, "/tmp/run 1");
  EXPECT_EQ(config.parallelism.virtual_pipeline_model_parallel_size, 4);
  EXPECT_EQ(config.parallelism.microbatch_group_size_per_vp_stage, 8);
  EXPECT_EQ(config.parallelism.timeout, std::chrono::seconds(90));
  EXPECT_EQ(config.parallelism.backend, std::optional<parallel::Backend>(parallel::Backend::kNccl));
  EXPECT_EQ(config.parallelism.device, "cuda:1");
  EXPECT_EQ(config.rng.seed, 18446744073709551615ULL);
  EXPECT_EQ(config.model.num_layers, 3);
  EXPECT_EQ(config.model.hidden_size, 48);

  // Later overrides win; null unsets optionals and clears strings and lists; one item needs no brackets.
  apply_override(config, "train.train_iters=7");
  apply_override(config, "parallelism.virtual_pipeline_model_parallel_size=null");
  apply_override(config, "parallelism.microbatch_group_size_per_vp_stage=");
  apply_override(config, "checkpoint.save=~");
  apply_override(config, "dataset.data_path=/data/only_text_document");
  EXPECT_EQ(config.train.train_iters, 7);
  EXPECT_EQ(config.parallelism.virtual_pipeline_model_parallel_size, std::nullopt);
  EXPECT_EQ(config.parallelism.microbatch_group_size_per_vp_stage, std::nullopt);
  EXPECT_EQ(config.checkpoint.save, "");
  EXPECT_EQ(config.dataset.data_path, std::vector<std::string>{"/data/only_text_document"});
  apply_override(config, "dataset.data_path=[]");
  EXPECT_TRUE(config.dataset.data_path.empty());
}

TEST(ConfigYaml, DurationsTakeAUnit) {
  ConfigContainer config;
  for (const auto& [text, ms] : std::map<std::string, int64_t>{
           {"250ms", 250}, {"30s", 30'000}, {"10min", 600'000}, {"10m", 600'000}, {"2h", 7'200'000}}) {
    apply_override(config, "parallelism.timeout=" + text);
    EXPECT_EQ(config.parallelism.timeout.count(), ms) << text;
  }
  EXPECT_THAT(override_error("parallelism.timeout=600"),
              AllOf(HasSubstr("parallelism.timeout must be a duration with a unit"), HasSubstr("'600'")));
  EXPECT_THAT(override_error("parallelism.timeout=5 days"), HasSubstr("'5 days'"));
}

TEST(ConfigYaml, UnknownKeysNameTheKeyAndSuggestTheClosest) {
  // A typo in the key.
  EXPECT_THAT(override_error("train.global_bach_size=8"),
              AllOf(HasSubstr("unknown config key 'train.global_bach_size'"),
                    HasSubstr("did you mean 'train.global_batch_size'?")));
  // The right name without its section, or in the wrong one.
  EXPECT_THAT(override_error("global_batch_size=8"), HasSubstr("did you mean 'train.global_batch_size'?"));
  EXPECT_THAT(override_error("model.train_iters=8"), HasSubstr("did you mean 'train.train_iters'?"));
  // A typo in the section.
  EXPECT_THAT(override_error("trian.train_iters=8"), HasSubstr("did you mean 'train.train_iters'?"));
  // A key's exact name in another section wins over a near spelling in this one (train.eval_interval).
  EXPECT_THAT(override_error("train.log_interval=5"), HasSubstr("did you mean 'logging.log_interval'?"));
  EXPECT_THAT(override_error("train.lr=0.1"), HasSubstr("did you mean 'optimizer.lr'?"));
  // Of several sections with the name, the nearest: model.vocab_size, not tokenizer.vocab_size.
  EXPECT_THAT(override_error("modl.vocab_size=8"), HasSubstr("did you mean 'model.vocab_size'?"));
  // Nothing close: the section's keys, or the sections.
  EXPECT_THAT(override_error("rng.zzzzzzzz=1"), HasSubstr("the keys of 'rng' are rng.seed"));
  EXPECT_THAT(override_error("zzzzzzzz.qqqqqq=1"), HasSubstr("the sections are model, train, optimizer"));

  // In YAML, with file, line and column.
  const std::string yaml_error =
      config_error([] { load_config_yaml_string("model:\n  num_layers: 2\n  hiden_size: 64\n", "recipe.yaml"); });
  EXPECT_THAT(yaml_error, AllOf(HasSubstr("recipe.yaml:3:3"), HasSubstr("'model.hiden_size'"),
                                HasSubstr("did you mean 'model.hidden_size'?")));
}

// ~key unsets: the default, and no longer among the keys the user set; so does key=null on a key that takes no null.
TEST(ConfigYaml, OverridesReportTheKeysTheUserSetAndTildeUnsets) {
  ConfigContainer config = load_config_yaml_string("model: {num_layers: 4, ffn_hidden_size: 512}\n", "recipe.yaml");
  const std::set<std::string> keys =
      apply_overrides(config, {"model.num_layers=6", "model.tensor_model_parallel_size=2",
                               "model={hidden_size: 96, kv_channels: 24}", "~model.ffn_hidden_size",
                               "train.train_iters=5", "train.train_iters=null", "mixed_precision=bf16_mixed"});
  EXPECT_EQ(config.model.num_layers, 6);
  EXPECT_EQ(config.model.ffn_hidden_size, 0);  // not given: 4 x hidden_size
  EXPECT_EQ(config.train.train_iters, 0);
  EXPECT_TRUE(keys.count("model.num_layers"));
  EXPECT_TRUE(keys.count("parallelism.tensor_model_parallel_size"));  // Megatron-Bridge's name, bridge's key
  EXPECT_TRUE(keys.count("model.hidden_size") && keys.count("model.kv_channels"));  // a section set whole
  EXPECT_TRUE(keys.count("mixed_precision.bf16") && keys.count("mixed_precision.grad_reduce_in_fp32"));
  EXPECT_FALSE(keys.count("model.ffn_hidden_size"));  // the recipe's and then unset
  EXPECT_FALSE(keys.count("train.train_iters"));      // set, then null
  EXPECT_FALSE(keys.count("model.seq_length"));       // never written

  const std::set<std::string> unset = apply_overrides(config, {"model.num_layers=6", "~model.num_layers"});
  EXPECT_TRUE(unset.empty());
  EXPECT_EQ(config.model.num_layers, ConfigContainer().model.num_layers);
  const OverriddenKeys one = apply_override(config, "~logger.log_interval");
  EXPECT_EQ(one.unset, (std::vector<std::string>{"logging.log_interval"}));
}

// An hf:<dir> start: the directory's config.json decides the architecture over a recipe's model.* (the embedded
// tiny recipe or the same file by --config), an override that agrees is fine, one that disagrees names both values,
// and ~key hands a key back to the directory.
TEST(ConfigYaml, AnHfStartsConfigJsonWinsOverTheRecipeButNotOverTheUser) {
  const fs::path hf = fs::temp_directory_path() / ("bridge_hf_start_" + std::to_string(::getpid()));
  fs::create_directories(hf);
  std::ofstream(hf / "config.json") << R"({"model_type": "gpt2", "n_layer": 3, "n_embd": 48, "n_head": 4,
                                         "vocab_size": 301, "n_positions": 128})";
  const std::string start = "checkpoint.pretrained_checkpoint=hf:" + hf.string();
  const auto resolve = [&](std::vector<std::string> overrides) {
    ConfigContainer config = load_config_yaml(kSourceDir / "examples/recipes/tiny.yaml");  // 4 layers, 128 wide
    overrides.insert(overrides.begin(), start);
    adopt_hf_architecture(config, apply_overrides(config, overrides));
    return config;
  };
  const ConfigContainer adopted = resolve({});
  EXPECT_EQ(adopted.model.num_layers, 3);
  EXPECT_EQ(adopted.model.hidden_size, 48);
  EXPECT_EQ(adopted.model.vocab_size, 301);
  EXPECT_EQ(adopted.model.seq_length, 64);  // the recipe's: not an architecture field
  EXPECT_EQ(adopted.train.train_iters, 500);
  EXPECT_EQ(to_yaml(resolve({"model.num_layers=3", "model.seq_length=32"})), to_yaml(resolve({"model.seq_length=32"})));
  // ~key puts the default (2 layers, not the directory's 3) and hands the key back: the directory decides again.
  EXPECT_EQ(to_yaml(resolve({"model.num_layers=4", "~model.num_layers"})), to_yaml(adopted));
  EXPECT_EQ(to_yaml(resolve({"model.ffn_hidden_size=null"})), to_yaml(adopted));
  EXPECT_THAT(config_error([&] {
                resolve({"model.num_layers=4", "model.num_attention_heads=4"});
              }),
              AllOf(HasSubstr("takes the model from its config.json, but model.num_layers (4, config.json: 3) "
                              "disagrees, as set on the command line"),
                    ::testing::Not(HasSubstr("num_attention_heads"))));
  EXPECT_THAT(config_error([&] { resolve({"model={hidden_size: 32}"}); }),
              HasSubstr("model.hidden_size (32, config.json: 48)"));
  // The run's own choices are checked against the directory before any rank starts, too.
  EXPECT_THAT(config_error([&] { resolve({"model.seq_length=256"}); }),
              HasSubstr("model.seq_length must be at most 128 (n_positions)"));
  EXPECT_THAT(config_error([&] { resolve({start + "/absent"}); }),
              AllOf(HasSubstr("checkpoint.pretrained_checkpoint=hf:"), HasSubstr("config.json")));
  fs::remove_all(hf);
}

TEST(ConfigYaml, WrongTypesNameTheKeyTheTypeAndTheValue) {
  EXPECT_THAT(override_error("train.train_iters=abc"),
              AllOf(HasSubstr("train.train_iters must be an int, got 'abc'"), HasSubstr("override")));
  EXPECT_THAT(override_error("train.train_iters=1.5"), HasSubstr("must be an int, got '1.5'"));
  EXPECT_THAT(override_error("parallelism.tensor_model_parallel_size=3000000000"),
              HasSubstr("must be an int, got '3000000000'"));  // beyond int
  EXPECT_THAT(override_error("rng.seed=-1"), HasSubstr("rng.seed must be an unsigned int, got '-1'"));
  EXPECT_THAT(override_error("optimizer.lr=fast"), HasSubstr("optimizer.lr must be a float, got 'fast'"));
  EXPECT_THAT(override_error("train.skip_train=maybe"), HasSubstr("train.skip_train must be a bool, got 'maybe'"));
  EXPECT_THAT(override_error("train.train_iters=[1, 2]"), HasSubstr("must be an int, got a list"));
  EXPECT_THAT(override_error("dataset.data_path=[[a]]"), HasSubstr("must be a list of strings, got a list"));
  EXPECT_THAT(override_error("dataset.split={a: 1}"), HasSubstr("must be a string, got a mapping"));
  EXPECT_THAT(override_error("parallelism.virtual_pipeline_model_parallel_size=two"),
              HasSubstr("must be an int or null, got 'two'"));
  EXPECT_THAT(override_error("parallelism.backend=mpi"), HasSubstr("must be a gloo or nccl or null, got 'mpi'"));
  EXPECT_THAT(override_error("train=5"), HasSubstr("'train' is a section, not a value"));
  EXPECT_THAT(override_error("train.train_iters"), HasSubstr("an override is key=value"));

  const std::string yaml_error =
      config_error([] { load_config_yaml_string("train:\n  micro_batch_size: 2\n  train_iters: ten\n", "r.yaml"); });
  EXPECT_THAT(yaml_error, AllOf(HasSubstr("r.yaml:3:16"), HasSubstr("train.train_iters must be an int, got 'ten'")));
}

TEST(ConfigYaml, BadYamlGivesFileAndLine) {
  EXPECT_THAT(config_error([] { load_config_yaml_string("model:\n  num_layers: 2\n  hidden_size: [64\n", "a.yaml"); }),
              AllOf(HasSubstr("a.yaml:4"), HasSubstr("bad YAML")));
  EXPECT_THAT(config_error([] { load_config_yaml_string("train:\n  eval_iters: 1\n   x: : 2\n", "b.yaml"); }),
              AllOf(HasSubstr("b.yaml:3"), HasSubstr("bad YAML")));
  EXPECT_THAT(config_error([] { load_config_yaml_string("- a\n- b\n", "c.yaml"); }),
              HasSubstr("c.yaml:1:1: the top level must be a mapping of sections"));
  EXPECT_THAT(config_error([] { load_config_yaml_string("train:\n  train_iters: 1\n  train_iters: 2\n", "d.yaml"); }),
              HasSubstr("d.yaml:3:3: train.train_iters is set twice"));
  EXPECT_THAT(override_error("train.train_iters=[1,"), AllOf(HasSubstr("override"), HasSubstr("bad YAML")));
  EXPECT_THAT(config_error([] { load_config_yaml("/nonexistent/recipe.yaml"); }),
              HasSubstr("cannot read the config file '/nonexistent/recipe.yaml'"));
}

TEST(ConfigYaml, ToYamlRoundTripsEveryType) {
  ConfigContainer config;
  config.model.num_layers = 7;
  config.model.layernorm_epsilon = 1.0 / 3.0;  // needs all 17 digits
  config.model.init_method_std = 0.1 + 0.2;
  config.model.init_seed = 18446744073709551615ULL;
  config.model.share_embeddings_and_output_weights = false;
  config.train.eval_interval = -3;
  config.optimizer.adam_eps = 1e-300;
  config.optimizer.optimizer = "sgd";
  config.parallelism.virtual_pipeline_model_parallel_size = 3;
  config.parallelism.backend = parallel::Backend::kNccl;
  config.parallelism.timeout = std::chrono::milliseconds(90'001);
  config.dataset.data_path = {"a b", "yes", "null", "", "#x", "1e3", "[x]", "key: value", "line\nbreak"};
  config.dataset.split = "true";
  config.checkpoint.save = "~";
  config.logging.runtime_time_unit = "'quoted'";

  const std::string yaml = to_yaml(config);
  const ConfigContainer loaded = load_config_yaml_string(yaml, "<to_yaml>");
  EXPECT_EQ(to_yaml(loaded), yaml);
  EXPECT_EQ(loaded.model.num_layers, 7);
  EXPECT_EQ(loaded.model.layernorm_epsilon, 1.0 / 3.0);
  EXPECT_EQ(loaded.model.init_method_std, 0.1 + 0.2);
  EXPECT_EQ(loaded.model.init_seed, 18446744073709551615ULL);
  EXPECT_FALSE(loaded.model.share_embeddings_and_output_weights);
  EXPECT_EQ(loaded.train.eval_interval, -3);
  EXPECT_EQ(loaded.optimizer.adam_eps, 1e-300);
  EXPECT_EQ(loaded.optimizer.optimizer, "sgd");
  EXPECT_EQ(loaded.parallelism.virtual_pipeline_model_parallel_size, 3);
  EXPECT_EQ(loaded.parallelism.microbatch_group_size_per_vp_stage, std::nullopt);
  EXPECT_EQ(loaded.parallelism.backend, std::optional<parallel::Backend>(parallel::Backend::kNccl));
  EXPECT_EQ(loaded.parallelism.timeout.count(), 90'001);
  EXPECT_EQ(loaded.dataset.data_path, config.dataset.data_path);
  EXPECT_EQ(loaded.dataset.split, "true");
  EXPECT_EQ(loaded.checkpoint.save, "~");
  EXPECT_EQ(loaded.logging.runtime_time_unit, "'quoted'");
  // The defaults round-trip too.
  EXPECT_EQ(to_yaml(load_config_yaml_string(to_yaml(ConfigContainer{}))), to_yaml(ConfigContainer{}));
}

TEST(ConfigYaml, EveryKeyAppearsInToYamlAndInTheHelp) {
  const std::vector<ConfigKeyInfo> keys = config_keys();
  const std::string help = config_help();
  std::set<std::string> unique;
  for (const ConfigKeyInfo& info : keys) {
    EXPECT_TRUE(unique.insert(info.key).second) << "duplicate key " << info.key;
    EXPECT_FALSE(info.doc.empty()) << info.key;
    EXPECT_THAT(help, HasSubstr("  " + info.key + " (" + info.type + ", default ")) << info.key;
  }
  // to_yaml writes one "leaf:" line per key, under its section, and then the callbacks list (one line when empty).
  std::istringstream lines(to_yaml(ConfigContainer{}));
  std::string line, section;
  std::set<std::string> emitted;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line == "callbacks: []") continue;
    if (line[0] != ' ') {
      section = line.substr(0, line.find(':'));
    } else {
      emitted.insert(section + "." + line.substr(2, line.find(':') - 2));
    }
  }
  EXPECT_EQ(emitted, unique);
  // The help shows the defaults.
  EXPECT_THAT(help, HasSubstr("  train.micro_batch_size (int, default 1)"));
  EXPECT_THAT(help, HasSubstr("  parallelism.timeout (duration, default 10min)"));
  EXPECT_THAT(help, HasSubstr("  parallelism.virtual_pipeline_model_parallel_size (int or null, default null)"));
}

// ---- The key table against the headers ----

// The data members declared in `struct name { ... }` of `text`, as (type, name), skipping member functions.
std::vector<std::pair<std::string, std::string>> declared_members(const std::string& text, const std::string& name) {
  const std::regex opening("struct\\s+" + name + "\\s*\\{");
  std::smatch match;
  if (!std::regex_search(text, match, opening)) return {};
  // The body, with comments and nested {...} (inline function bodies, brace initialisers) replaced by ';'.
  std::string body;
  int depth = 1;
  for (std::size_t i = match.position(0) + match.length(0); i < text.size() && depth > 0; ++i) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      body += '\n';
      continue;
    }
    if (text[i] == '{') {
      if (depth++ == 1) body += ';';
    } else if (text[i] == '}') {
      --depth;
    } else if (depth == 1) {
      body += text[i];
    }
  }
  // Template arguments hold parentheses and commas that are not the declaration's.
  std::string flat;
  int angle = 0;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (body.compare(i, 2, "<<") == 0) {  // a shift in an initialiser, not a template
      ++i;
      continue;
    }
    if (c == '<') ++angle;
    if (angle == 0) flat += (c == '\n' ? ' ' : c);
    if (c == '>') --angle;
  }
  std::vector<std::pair<std::string, std::string>> members;
  std::istringstream statements(flat);
  std::string statement;
  const std::regex first(
      "^\\s*(?:public:|private:)?\\s*([A-Za-z_][\\w:]*(?:\\s+[A-Za-z_][\\w:]*)*?)\\s+([A-Za-z_]\\w*)$");
  while (std::getline(statements, statement, ';')) {
    const std::size_t equals = statement.find('=');
    const std::size_t paren = statement.find('(');
    if (paren != std::string::npos && (equals == std::string::npos || paren < equals)) continue;  // a function
    if (std::regex_search(statement, std::regex("^\\s*static\\b"))) continue;  // a class constant, not a field
    std::istringstream declarators(statement);
    std::string declarator, type;
    bool is_first = true;
    while (std::getline(declarators, declarator, ',')) {
      std::string head = declarator.substr(0, declarator.find('='));
      head.erase(head.find_last_not_of(" \t") + 1);
      std::smatch parts;
      if (is_first) {
        if (!std::regex_match(head, parts, first)) break;
        type = parts[1];
        members.emplace_back(type, parts[2]);
        is_first = false;
      } else if (std::regex_match(head, parts, std::regex("^\\s*([A-Za-z_]\\w*)$"))) {
        members.emplace_back(type, parts[1]);
      }
    }
  }
  return members;
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(ConfigYaml, TheKeyTableCoversEveryFieldOfTheConfigHeaders) {
  // Where the section structs live; a section type defined elsewhere fails below, naming it.
  std::string headers;
  for (const char* header :
       {"training/config/config.h", "bridge/models/gpt_config.h", "training/optimizer/optimizer.h",
        "parallel/distributed/distributed_data_parallel.h", "training/tokenizers/build_tokenizer.h"}) {
    headers += read_file(kSourceDir / header);
  }
  const std::set<std::string> not_settable = {"dataset.provider"};  // code, not data

  const auto sections = declared_members(headers, "ConfigContainer");
  ASSERT_GE(sections.size(), 10u) << "could not read ConfigContainer's members from training/config/config.h";
  std::set<std::string> declared;
  for (const auto& [type, section] : sections) {
    if (section == "callbacks") continue;  // a list of entries, not a section (CallbacksFromYaml tests it)
    const std::string struct_name = type.substr(type.rfind(':') == std::string::npos ? 0 : type.rfind(':') + 1);
    const auto members = declared_members(headers, struct_name);
    ASSERT_FALSE(members.empty()) << "struct " << struct_name << " (ConfigContainer::" << section
                                  << ") not found; add its header to this test";
    for (const auto& [member_type, member] : members) {
      if (!not_settable.count(section + "." + member)) declared.insert(section + "." + member);
    }
  }
  std::set<std::string> table;
  for (const ConfigKeyInfo& info : config_keys()) table.insert(info.key);
  for (const std::string& key : declared) {
    EXPECT_TRUE(table.count(key)) << key
                                  << " is declared in the config headers but missing from the key table in "
                                     "training/config/config_table.cpp (add a field(...) row)";
  }
  for (const std::string& key : table) EXPECT_TRUE(declared.count(key)) << key << " is in the table only";
  // The parser sees multi-declarator lines, wrapped initialisers and optionals.
  EXPECT_TRUE(declared.count("optimizer.adam_eps"));
  EXPECT_TRUE(declared.count("ddp.average_in_collective"));
  EXPECT_TRUE(declared.count("parallelism.virtual_pipeline_model_parallel_size"));
  EXPECT_FALSE(declared.count("model.ffn_size"));  // a member function
}

// ---- The callbacks list ----

TEST(CallbacksFromYaml, EntriesKeepTheirOptionsAndRoundTrip) {
  const ConfigContainer config = load_config_yaml_string(
      "callbacks:\n"
      "  - {type: EarlyStopping, monitor: lm loss validation, patience: 2, min_delta: 0.01}\n"
      "  - type: TimeLimit\n"
      "    duration: 210min\n"
      "  - {type: ProgressBar}\n");
  ASSERT_EQ(config.callbacks.size(), 3u);
  EXPECT_EQ(config.callbacks[0].type, "EarlyStopping");
  EXPECT_EQ(config.callbacks[0].options,
            (std::map<std::string, std::string>{
                {"monitor", "lm loss validation"}, {"patience", "2"}, {"min_delta", "0.01"}}));
  EXPECT_EQ(config.callbacks[1].options.at("duration"), "210min");
  EXPECT_TRUE(config.callbacks[2].options.empty());
  const std::string yaml = to_yaml(config);
  EXPECT_THAT(yaml, HasSubstr("- {type: ProgressBar}"));
  EXPECT_EQ(load_config_yaml_string(yaml).callbacks, config.callbacks);
  EXPECT_THAT(to_yaml(ConfigContainer{}), HasSubstr("callbacks: []"));

  ConfigContainer overridden = config;
  apply_override(overridden, "callbacks=[{type: SpeedMonitor, window_size: 10}]");
  ASSERT_EQ(overridden.callbacks.size(), 1u);  // the list is replaced, as any key
  EXPECT_EQ(overridden.callbacks[0].options.at("window_size"), "10");
  apply_override(overridden, "callbacks=[]");
  EXPECT_TRUE(overridden.callbacks.empty());
}

TEST(CallbacksFromYaml, ErrorsNameTheEntryTheOptionAndTheClosestName) {
  EXPECT_THAT(override_error("callbacks=[{type: EarlyStoping}]"),
              AllOf(HasSubstr("callbacks[0]: unknown callback type 'EarlyStoping'; did you mean 'EarlyStopping'?"),
                    HasSubstr("The types are ControlEndpoint, DivergenceDetector, EarlyStopping")));
  EXPECT_THAT(override_error("callbacks=[{type: ProgressBar}, {type: EarlyStopping, patince: 3}]"),
              HasSubstr("callbacks[1]: EarlyStopping has no option 'patince'; did you mean 'patience'?"));
  EXPECT_THAT(override_error("callbacks=[{type: EarlyStopping, patience: many}]"),
              HasSubstr("callbacks[0].patience must be an int, got 'many'"));
  EXPECT_THAT(override_error("callbacks=[{type: EarlyStopping, patience: 0}]"),
              HasSubstr("callbacks[0]: EarlyStopping.patience is 0"));
  EXPECT_THAT(override_error("callbacks=[{type: TimeLimit, duration: 90}]"),
              HasSubstr("callbacks[0].duration must be a duration with a unit"));
  EXPECT_THAT(override_error("callbacks=[{patience: 3}]"), HasSubstr("callbacks[0]: the entry has no type"));
  EXPECT_THAT(override_error("callbacks={type: EarlyStopping}"), HasSubstr("callbacks must be a list"));
  EXPECT_THAT(config_error([] {
                load_config_yaml_string("train:\n  train_iters: 3\ncallbacks:\n  - {type: Nope}\n", "recipe.yaml");
              }),
              HasSubstr("recipe.yaml:4:5: callbacks[0]: unknown callback type 'Nope'"));
}

TEST(CallbacksFromYaml, TheHelpListsEveryBuiltInWithItsOptions) {
  const std::string help = config_help();
  for (const CallbackTypeInfo& type : builtin_callback_types()) {
    EXPECT_THAT(help, HasSubstr("  " + type.type + "\n")) << type.type;
    for (const CallbackOptionInfo& option : type.options) {
      EXPECT_THAT(help, HasSubstr("    " + option.name + " (" + option.type + ", default ")) << option.name;
    }
  }
  EXPECT_THAT(help, HasSubstr("    patience (int, default 3)"));
  EXPECT_THAT(help, HasSubstr("    duration (duration, default 0"));
  EXPECT_GE(builtin_callback_types().size(), 9u);
}

// --help-markdown (docs/config-reference.md): a table row per key under its section's heading, then a table per
// built-in callback; table cells stay cells ('|' escaped) and '<...>' stays text.
TEST(ConfigReferenceMarkdown, EveryKeyIsOneRowUnderItsSection) {
  const std::string markdown = config_reference_markdown();
  std::map<std::string, int> rows;  // key -> rows naming it
  std::string section;
  std::istringstream lines(markdown);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("## ", 0) == 0) section = line.substr(3);
    if (line.rfind("| `", 0) != 0) continue;
    const std::string key = line.substr(3, line.find('`', 3) - 3);
    if (section == "callbacks") continue;  // option rows
    EXPECT_EQ(key.substr(0, key.find('.')), section) << line;
    ++rows[key];
    // Four cells: a '|' inside one is escaped, so the unescaped ones are exactly the five borders.
    int borders = 0;
    for (std::size_t i = 0; i < line.size(); ++i) borders += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    EXPECT_EQ(borders, 5) << line;
  }
  for (const ConfigKeyInfo& info : config_keys()) EXPECT_EQ(rows[info.key], 1) << info.key;
  EXPECT_EQ(rows.size(), config_keys().size());
  for (const CallbackTypeInfo& type : builtin_callback_types()) {
    EXPECT_THAT(markdown, HasSubstr("\n### " + type.type + "\n")) << type.type;
  }
  EXPECT_THAT(markdown, HasSubstr("| `train.train_iters` | int | `0` | "));
  EXPECT_THAT(markdown, HasSubstr("cuda:&lt;index>"));  // an HTML tag to Markdown, were it not escaped
  EXPECT_EQ(markdown.find("<index>"), std::string::npos);
}

// ---- The shipped recipes ----

TEST(ConfigYaml, EveryRecipeLoadsAndValidatesForItsWorldSize) {
  const std::map<std::string, std::vector<int>> world_sizes = {{"tiny.yaml", {1, 2}},
                                                               {"tp2_pp2.yaml", {4}},
                                                               {"gpt2_124m.yaml", {1, 8}},
                                                               {"megatron_bridge_gpt.yaml", {1, 2}},
                                                               {"tiny_llama.yaml", {1, 2}},
                                                               {"llama3_8b.yaml", {2, 8}},
                                                               {"megatron_bridge_llama3_8b.yaml", {2, 8}},
                                                               {"qwen3_8b.yaml", {4, 8}},
                                                               {"megatron_bridge_qwen3_8b.yaml", {4, 8}},
                                                               {"tiny_moe.yaml", {1, 2}},
                                                               {"qwen3_30b_a3b.yaml", {8, 16}},
                                                               {"megatron_bridge_qwen3_30b_a3b.yaml", {8, 16}}};
  std::set<std::string> found;
  for (const auto& entry : fs::directory_iterator(kSourceDir / "examples" / "recipes")) {
    const std::string name = entry.path().filename().string();
    found.insert(name);
    ASSERT_TRUE(world_sizes.count(name)) << name << ": add it with its intended world sizes to this test";
    const ConfigContainer config = load_config_yaml(entry.path());
    for (int world_size : world_sizes.at(name)) {
      EXPECT_NO_THROW(config.validate(world_size)) << name << " at world size " << world_size;
    }
  }
  EXPECT_EQ(found.size(), world_sizes.size());

  const ConfigContainer gpt2 = load_config_yaml(kSourceDir / "examples/recipes/gpt2_124m.yaml");
  EXPECT_EQ(gpt2.model.num_layers, 12);
  EXPECT_EQ(gpt2.model.hidden_size, 768);
  EXPECT_EQ(gpt2.model.num_attention_heads, 12);
  EXPECT_EQ(gpt2.model.seq_length, 1024);
  EXPECT_EQ(gpt2.model.vocab_size, 50257);
  const ConfigContainer tp2_pp2 = load_config_yaml(kSourceDir / "examples/recipes/tp2_pp2.yaml");
  EXPECT_EQ(tp2_pp2.parallelism.tensor_model_parallel_size, 2);
  EXPECT_EQ(tp2_pp2.parallelism.pipeline_model_parallel_size, 2);
  EXPECT_THROW(tp2_pp2.validate(2), std::invalid_argument);
}

// Context parallelism's keys: the size under bridge's and Megatron-Bridge's names, the attention's exchange by
// Megatron-Core's names (its hierarchical a2a+p2p refused by name), and the layout and data checks, each naming the
// field and the fix.
TEST(ConfigYaml, ContextParallelKeysAndTheirChecks) {
  ConfigContainer config;
  apply_override(config, "parallelism.context_parallel_size=2");
  apply_override(config, "model.cp_comm_type=all_gather");
  EXPECT_EQ(config.parallelism.context_parallel_size, 2);
  EXPECT_EQ(config.model.cp_comm_type, parallel::context_parallel::CpCommType::kAllGather);
  EXPECT_EQ(ConfigContainer().model.cp_comm_type, parallel::context_parallel::CpCommType::kP2P);
  EXPECT_THAT(to_yaml(config), AllOf(HasSubstr("context_parallel_size: 2"), HasSubstr("cp_comm_type: all_gather")));
  EXPECT_THAT(override_error("model.cp_comm_type=a2a+p2p"),
              AllOf(HasSubstr("model.cp_comm_type: a2a+p2p"), HasSubstr("hierarchical context parallelism"),
                    HasSubstr("is not supported; use a2a"), HasSubstr("or p2p")));
  EXPECT_THAT(override_error("model.cp_comm_type=ring"),
              HasSubstr("model.cp_comm_type must be a p2p, all_gather or a2a, got 'ring'"));
  EXPECT_FALSE(ConfigContainer().model.rotary_interleaved);
  ConfigContainer interleaved;
  apply_override(interleaved, "model.rotary_interleaved=true");
  EXPECT_TRUE(interleaved.model.rotary_interleaved);

  config.model.attention_dropout = 0.0;
  config.parallelism.tensor_model_parallel_size = 2;
  config.train.global_batch_size = 2;
  EXPECT_NO_THROW(config.validate(8));
  EXPECT_EQ(config.data_parallel_size(8), 2);  // 8 / (tp 2 x cp 2)
  const auto validate_error = [](const ConfigContainer& c, int world_size) {
    try {
      c.validate(world_size);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    ADD_FAILURE() << "validated at world size " << world_size;
    return std::string();
  };
  EXPECT_THAT(validate_error(config, 6),
              AllOf(HasSubstr("the world size (6) must be divisible by parallelism.tensor_model_parallel_size x "
                              "parallelism.context_parallel_size x parallelism.pipeline_model_parallel_size (4)"),
                    HasSubstr("launch a multiple of 4 ranks")));
  config.dataset.reset_attention_mask = true;
  EXPECT_THAT(validate_error(config, 4),
              AllOf(HasSubstr("dataset.reset_attention_mask (document attention masks) is on with "
                              "parallelism.context_parallel_size 2"),
                    HasSubstr("packed THD"), HasSubstr("set dataset.reset_attention_mask: false")));
  config.dataset.reset_attention_mask = false;
  config.dataset.reset_position_ids = true;  // positions per document stay right after the split
  config.dataset.eod_mask_loss = true;
  EXPECT_NO_THROW(config.validate(4));
  config.parallelism.context_parallel_size = 0;
  EXPECT_THAT(validate_error(config, 4), HasSubstr("parallelism.context_parallel_size must be >= 1, got 0"));
}

}  // namespace
}  // namespace bridge::training
