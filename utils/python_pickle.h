// Python's pickle format, read into and written from a generic value tree, for files whose pickles name arbitrary
// Python classes: PyTorch Distributed Checkpoint's `.metadata` (Metadata, TensorStorageMetadata, torch.Size, ...,
// and Megatron-Core's SavePlan objects) and the data.pkl of torch.save's archives. LibTorch's own unpickler resolves
// every global against TorchScript's type system and refuses classes it does not know, so it cannot read these;
// Python's pickle machine is small enough to implement whole (protocols 0 to 5 as Python 3 writes them, without
// extensions and out-of-band buffers). Instances of classes stay opaque: an Object records which class or callable
// made it, its arguments and the state BUILD gave it, which is what a reader of dataclass-style pickles needs.
//
//   Value metadata = pickle::loads(read_file(dir / ".metadata"));
//   const Object& root = metadata.object();                   // Metadata(...), made by NEWOBJ then BUILD
//   const Value* tensors = root.state->dict().find("state_dict_metadata");
//   std::string bytes = pickle::dumps(metadata);              // protocol 4; Python's pickle.loads reads it back
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace bridge::utils::pickle {

class Value;

/// Python bytes (and bytearray): kept apart from str, which pickles differently.
struct Bytes {
  std::string data;
  bool operator==(const Bytes& other) const { return data == other.data; }
};

/// A reference to a module-level name (a class, a function, torch.float32): GLOBAL / STACK_GLOBAL.
struct Global {
  std::string module;
  std::string name;
  bool operator==(const Global& other) const { return module == other.module && name == other.name; }
};

struct Tuple {
  std::vector<Value> items;
};
struct List {
  std::vector<Value> items;
};
/// A dict in insertion order, as Python keeps it; keys may be any value (DCP keys storage_data by MetadataIndex).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  /// The value of the str key `key`, or nullptr.
  const Value* find(std::string_view key) const;
};
struct Object;

/// One Python value. Lists, dicts and objects are shared (as in Python, where a memo reference names the same
/// object); tuples are immutable and shared too. Copying a Value is cheap.
class Value {
 public:
  enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kGlobal, kObject };

  Value() = default;                   // None
  Value(bool value) : data_(value) {}  // NOLINT(google-explicit-constructor): values read like Python literals
  Value(int value) : data_(static_cast<int64_t>(value)) {}                // NOLINT(google-explicit-constructor)
  Value(int64_t value) : data_(value) {}                                  // NOLINT(google-explicit-constructor)
  Value(double value) : data_(value) {}                                   // NOLINT(google-explicit-constructor)
  Value(std::string value) : data_(std::move(value)) {}                   // NOLINT(google-explicit-constructor)
  Value(const char* value) : data_(std::string(value)) {}                 // NOLINT(google-explicit-constructor)
  Value(Bytes value) : data_(std::move(value)) {}                         // NOLINT(google-explicit-constructor)
  Value(Global value) : data_(std::move(value)) {}                        // NOLINT(google-explicit-constructor)
  Value(std::shared_ptr<const Tuple> value) : data_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Value(std::shared_ptr<List> value) : data_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Value(std::shared_ptr<Dict> value) : data_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Value(std::shared_ptr<Object> value) : data_(std::move(value)) {}       // NOLINT(google-explicit-constructor)

  static Value tuple(std::vector<Value> items);
  static Value list(std::vector<Value> items);
  static Value dict(std::vector<std::pair<Value, Value>> items);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  /// Python's name for the value's type: "int", "str", "tuple", "torch.Size object", "global torch.float32".
  std::string type_name() const;

  bool is_none() const { return kind() == Kind::kNone; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_str() const { return kind() == Kind::kStr; }
  bool is_tuple() const { return kind() == Kind::kTuple; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_global() const { return kind() == Kind::kGlobal; }
  bool is_object() const { return kind() == Kind::kObject; }

  // The accessors throw std::runtime_error saying what was expected and what the value is.
  bool as_bool() const;
  int64_t as_int() const;
  double as_float() const;  // also takes an int, as Python would
  const std::string& as_str() const;
  const std::string& as_bytes() const;
  const std::vector<Value>& tuple_items() const;
  const std::vector<Value>& list_items() const;
  std::vector<Value>& list_items();
  const Dict& dict() const;
  Dict& dict();
  const Global& global() const;
  const Object& object() const;
  Object& object();

  /// Deep equality (values, not identity); floats compare as doubles.
  bool operator==(const Value& other) const;
  bool operator!=(const Value& other) const { return !(*this == other); }

  /// A Python-like rendering for messages and tests: {'a': (1, 2.5)}, torch.Size((2, 3)), <global torch.float32>.
  std::string repr() const;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, Bytes, std::shared_ptr<const Tuple>,
               std::shared_ptr<List>, std::shared_ptr<Dict>, Global, std::shared_ptr<Object>>
      data_;
};

/// An instance of a Python class, or the result of calling a global, kept as the pickle describes it.
struct Object {
  enum class Made : uint8_t {
    kNewObj,        ///< cls.__new__(cls, *args, **kwargs): NEWOBJ / NEWOBJ_EX (dataclasses, most objects)
    kReduce,        ///< callable(*args): REDUCE (torch.Size((2, 3)), getattr(Enum, 'NAME'), set([...]))
    kPersistentId,  ///< persistent_load(args[0]): BINPERSID (torch.save's storages); `type` is empty
  };
  Global type;  ///< the class or callable
  Made made = Made::kNewObj;
  std::vector<Value> args;
  std::vector<std::pair<Value, Value>> kwargs;  ///< NEWOBJ_EX's keyword arguments
  std::optional<Value> state;                   ///< what BUILD passed (a dataclass's __dict__, or __getstate__'s)

  bool is(std::string_view module, std::string_view name) const { return type.module == module && type.name == name; }
  /// The attribute `name` of a dict state (a dataclass field), or nullptr when there is no such state or key.
  const Value* attribute(std::string_view name) const;
};

/// Objects made the way pickle makes a dataclass instance (NEWOBJ with no arguments, then BUILD with its __dict__),
/// a REDUCE call, a persistent id.
Value new_object(Global type, std::optional<Value> state);
Value reduce(Global callable, std::vector<Value> args);

/// Reads one pickle (any protocol 0..5). Throws std::runtime_error naming the opcode and its byte offset when the
/// bytes are not a pickle this reader understands: truncated, an unknown opcode, a memo reference never stored,
/// a stack underflow, bytes after STOP are ignored as Python does.
Value loads(std::string_view bytes);

/// Writes `value` as protocol 4 (no frames), memoizing globals and strings as Python's pickler does; Python's
/// pickle.loads reads it. Throws std::invalid_argument for an Object of kind kPersistentId without one argument.
std::string dumps(const Value& value);

}  // namespace bridge::utils::pickle
