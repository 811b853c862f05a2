// The generic pickle value tree and a protocol-4 writer of it (Python's pickler's opcodes, without frames); the
// reader is python_pickle_reader.cpp.
#include "utils/python_pickle.h"

#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

namespace bridge::utils::pickle {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_str() && k.as_str() == key) return &v;
  }
  return nullptr;
}

const Value* Object::attribute(std::string_view name) const {
  return state && state->is_dict() ? state->dict().find(name) : nullptr;
}

Value Value::tuple(std::vector<Value> items) {
  auto tuple = std::make_shared<Tuple>();
  tuple->items = std::move(items);
  return Value(std::shared_ptr<const Tuple>(std::move(tuple)));
}

Value Value::list(std::vector<Value> items) {
  auto list = std::make_shared<List>();
  list->items = std::move(items);
  return Value(std::move(list));
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  auto dict = std::make_shared<Dict>();
  dict->items = std::move(items);
  return Value(std::move(dict));
}

Value new_object(Global type, std::optional<Value> state) {
  auto object = std::make_shared<Object>();
  object->type = std::move(type);
  object->made = Object::Made::kNewObj;
  object->state = std::move(state);
  return Value(std::move(object));
}

Value reduce(Global callable, std::vector<Value> args) {
  auto object = std::make_shared<Object>();
  object->type = std::move(callable);
  object->made = Object::Made::kReduce;
  object->args = std::move(args);
  return Value(std::move(object));
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kGlobal:
      return "global " + global().module + "." + global().name;
    case Kind::kObject:
      return object().made == Object::Made::kPersistentId ? "persistent id"
                                                          : object().type.module + "." + object().type.name + " object";
  }
  return "?";
}

namespace {

[[noreturn]] void wrong_type(const Value& value, const char* expected) {
  throw std::runtime_error(std::string("expected ") + expected + ", got " + value.type_name() + " " + value.repr());
}

}  // namespace

bool Value::as_bool() const {
  if (kind() != Kind::kBool) wrong_type(*this, "a bool");
  return std::get<bool>(data_);
}
int64_t Value::as_int() const {
  if (kind() != Kind::kInt) wrong_type(*this, "an int");
  return std::get<int64_t>(data_);
}
double Value::as_float() const {
  if (kind() == Kind::kInt) return static_cast<double>(std::get<int64_t>(data_));
  if (kind() != Kind::kFloat) wrong_type(*this, "a float");
  return std::get<double>(data_);
}
const std::string& Value::as_str() const {
  if (kind() != Kind::kStr) wrong_type(*this, "a str");
  return std::get<std::string>(data_);
}
const std::string& Value::as_bytes() const {
  if (kind() != Kind::kBytes) wrong_type(*this, "bytes");
  return std::get<Bytes>(data_).data;
}
const std::vector<Value>& Value::tuple_items() const {
  if (kind() != Kind::kTuple) wrong_type(*this, "a tuple");
  return std::get<std::shared_ptr<const Tuple>>(data_)->items;
}
const std::vector<Value>& Value::list_items() const {
  if (kind() != Kind::kList) wrong_type(*this, "a list");
  return std::get<std::shared_ptr<List>>(data_)->items;
}
std::vector<Value>& Value::list_items() {
  if (kind() != Kind::kList) wrong_type(*this, "a list");
  return std::get<std::shared_ptr<List>>(data_)->items;
}
const Dict& Value::dict() const {
  if (kind() != Kind::kDict) wrong_type(*this, "a dict");
  return *std::get<std::shared_ptr<Dict>>(data_);
}
Dict& Value::dict() {
  if (kind() != Kind::kDict) wrong_type(*this, "a dict");
  return *std::get<std::shared_ptr<Dict>>(data_);
}
const Global& Value::global() const {
  if (kind() != Kind::kGlobal) wrong_type(*this, "a global");
  return std::get<Global>(data_);
}
const Object& Value::object() const {
  if (kind() != Kind::kObject) wrong_type(*this, "an object");
  return *std::get<std::shared_ptr<Object>>(data_);
}
Object& Value::object() {
  if (kind() != Kind::kObject) wrong_type(*this, "an object");
  return *std::get<std::shared_ptr<Object>>(data_);
}

bool Value::operator==(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return as_bool() == other.as_bool();
    case Kind::kInt:
      return as_int() == other.as_int();
    case Kind::kFloat:
      return as_float() == other.as_float() || (std::isnan(as_float()) && std::isnan(other.as_float()));
    case Kind::kStr:
      return as_str() == other.as_str();
    case Kind::kBytes:
      return as_bytes() == other.as_bytes();
    case Kind::kTuple:
      return tuple_items() == other.tuple_items();
    case Kind::kList:
      return list_items() == other.list_items();
    case Kind::kDict:
      return dict().items == other.dict().items;
    case Kind::kGlobal:
      return global() == other.global();
    case Kind::kObject: {
      const Object& a = object();
      const Object& b = other.object();
      return a.type == b.type && a.made == b.made && a.args == b.args && a.kwargs == b.kwargs && a.state == b.state;
    }
  }
  return false;
}

namespace {

void quote(std::ostringstream& out, const std::string& text, char prefix) {
  if (prefix != 0) out << prefix;
  out << '\'';
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\'' || c == '\\') {
      out << '\\' << c;
    } else if (byte < 0x20 || byte == 0x7f || (prefix == 'b' && byte >= 0x80)) {
      constexpr char kDigits[] = "0123456789abcdef";
      out << "\\x" << kDigits[byte >> 4] << kDigits[byte & 15];
    } else {
      out << c;
    }
  }
  out << '\'';
}

void repr_items(std::ostringstream& out, const std::vector<Value>& items) {
  for (std::size_t i = 0; i < items.size(); ++i) out << (i ? ", " : "") << items[i].repr();
}

}  // namespace

std::string Value::repr() const {
  std::ostringstream out;
  switch (kind()) {
    case Kind::kNone:
      out << "None";
      break;
    case Kind::kBool:
      out << (as_bool() ? "True" : "False");
      break;
    case Kind::kInt:
      out << as_int();
      break;
    case Kind::kFloat:
      out << as_float();
      break;
    case Kind::kStr:
      quote(out, as_str(), 0);
      break;
    case Kind::kBytes:
      quote(out, as_bytes(), 'b');
      break;
    case Kind::kTuple:
      out << '(';
      repr_items(out, tuple_items());
      out << (tuple_items().size() == 1 ? ",)" : ")");
      break;
    case Kind::kList:
      out << '[';
      repr_items(out, list_items());
      out << ']';
      break;
    case Kind::kDict: {
      out << '{';
      bool first = true;
      for (const auto& [k, v] : dict().items) {
        out << (first ? "" : ", ") << k.repr() << ": " << v.repr();
        first = false;
      }
      out << '}';
      break;
    }
    case Kind::kGlobal:
      out << "<global " << global().module << '.' << global().name << '>';
      break;
    case Kind::kObject: {
      const Object& object = this->object();
      if (object.made == Object::Made::kPersistentId) {
        out << "persistent_id(";
      } else {
        out << object.type.module << '.' << object.type.name << '(';
      }
      repr_items(out, object.args);
      for (const auto& [k, v] : object.kwargs) out << ", " << k.repr() << '=' << v.repr();
      out << ')';
      if (object.state) out << " with state " << object.state->repr();
      break;
    }
  }
  return out.str();
}

// ---------------------------------------------------------------------------------------------------------------
// Writing

namespace {

class Pickler {
 public:
  std::string run(const Value& value) {
    out_ += "\x80\x04";
    write(value);
    out_ += '.';
    return std::move(out_);
  }

 private:
  void little(uint64_t value, int width) {
    for (int i = 0; i < width; ++i) out_ += static_cast<char>((value >> (8 * i)) & 0xff);
  }

  // Emits MEMOIZE for the value just written, and records its index under `key`.
  void memoize(std::map<std::string, uint64_t>& table, const std::string& key) {
    out_ += '\x94';
    table.emplace(key, next_memo_++);
  }
  bool recall(const std::map<std::string, uint64_t>& table, const std::string& key) {
    const auto found = table.find(key);
    if (found == table.end()) return false;
    if (found->second < 256) {
      out_ += 'h';
      little(found->second, 1);
    } else {
      out_ += 'j';
      little(found->second, 4);
    }
    return true;
  }

  void write_int(int64_t value) {
    if (value >= 0 && value < 256) {
      out_ += 'K';
      little(static_cast<uint64_t>(value), 1);
    } else if (value >= 0 && value < 65536) {
      out_ += 'M';
      little(static_cast<uint64_t>(value), 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      out_ += 'J';
      little(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(value))), 4);
    } else {
      // LONG1: the fewest two's-complement bytes that keep the sign.
      const auto bits = static_cast<uint64_t>(value);
      int n = 8;
      while (n > 1) {
        const auto byte = static_cast<unsigned char>(bits >> (8 * (n - 1)));
        const auto below = static_cast<unsigned char>(bits >> (8 * (n - 2)));
        if ((byte == 0x00 && below < 0x80) || (byte == 0xff && below >= 0x80)) {
          --n;
        } else {
          break;
        }
      }
      out_ += '\x8a';
      little(static_cast<uint64_t>(n), 1);
      little(bits, n);
    }
  }

  void write_str(const std::string& text) {
    if (recall(strings_, text)) return;
    if (text.size() < 256) {
      out_ += '\x8c';
      little(text.size(), 1);
    } else if (text.size() <= UINT32_MAX) {
      out_ += 'X';
      little(text.size(), 4);
    } else {
      out_ += '\x8d';
      little(text.size(), 8);
    }
    out_ += text;
    memoize(strings_, text);
  }

  void write_global(const Global& global) {
    const std::string key = global.module + '\n' + global.name;
    if (recall(globals_, key)) return;
    write_str(global.module);
    write_str(global.name);
    out_ += '\x93';  // STACK_GLOBAL
    memoize(globals_, key);
  }

  void write_tuple(const std::vector<Value>& items) {
    if (items.empty()) {
      out_ += ')';
      return;
    }
    if (items.size() > 3) out_ += '(';
    for (const Value& item : items) write(item);
    out_ += items.size() > 3 ? 't' : static_cast<char>(0x84 + items.size());
  }

  void write(const Value& value) {
    switch (value.kind()) {
      case Value::Kind::kNone:
        out_ += 'N';
        return;
      case Value::Kind::kBool:
        out_ += value.as_bool() ? '\x88' : '\x89';
        return;
      case Value::Kind::kInt:
        write_int(value.as_int());
        return;
      case Value::Kind::kFloat: {
        const double number = value.as_float();
        uint64_t bits = 0;
        std::memcpy(&bits, &number, sizeof bits);
        out_ += 'G';
        for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
        return;
      }
      case Value::Kind::kStr:
        write_str(value.as_str());
        return;
      case Value::Kind::kBytes: {
        const std::string& data = value.as_bytes();
        if (data.size() < 256) {
          out_ += 'C';
          little(data.size(), 1);
        } else if (data.size() <= UINT32_MAX) {
          out_ += 'B';
          little(data.size(), 4);
        } else {
          out_ += '\x8e';
          little(data.size(), 8);
        }
        out_ += data;
        return;
      }
      case Value::Kind::kTuple:
        write_tuple(value.tuple_items());
        return;
      case Value::Kind::kList: {
        out_ += ']';
        const auto& items = value.list_items();
        // Python's pickler appends in batches of 1000, so its unpickler's stack stays small.
        for (std::size_t start = 0; start < items.size(); start += 1000) {
          out_ += '(';
          for (std::size_t i = start; i < std::min(items.size(), start + 1000); ++i) write(items[i]);
          out_ += 'e';
        }
        return;
      }
      case Value::Kind::kDict: {
        out_ += '}';
        const auto& items = value.dict().items;
        for (std::size_t start = 0; start < items.size(); start += 1000) {
          out_ += '(';
          for (std::size_t i = start; i < std::min(items.size(), start + 1000); ++i) {
            write(items[i].first);
            write(items[i].second);
          }
          out_ += 'u';
        }
        return;
      }
      case Value::Kind::kGlobal:
        write_global(value.global());
        return;
      case Value::Kind::kObject: {
        const Object& object = value.object();
        if (object.made == Object::Made::kPersistentId) {
          if (object.args.size() != 1) {
            throw std::invalid_argument("a persistent id needs exactly one argument, not " +
                                        std::to_string(object.args.size()));
          }
          write(object.args[0]);
          out_ += 'Q';
        } else {
          write_global(object.type);
          write_tuple(object.args);
          if (object.made == Object::Made::kReduce) {
            if (!object.kwargs.empty()) {
              throw std::invalid_argument("a REDUCE call (" + object.type.module + "." + object.type.name +
                                          ") cannot take keyword arguments");
            }
            out_ += 'R';
          } else if (object.kwargs.empty()) {
            out_ += '\x81';  // NEWOBJ
          } else {
            write(Value::dict(object.kwargs));
            out_ += '\x92';  // NEWOBJ_EX
          }
        }
        if (object.state) {
          write(*object.state);
          out_ += 'b';
        }
        return;
      }
    }
  }

  std::string out_;
  uint64_t next_memo_ = 0;
  std::map<std::string, uint64_t> strings_;
  std::map<std::string, uint64_t> globals_;
};

}  // namespace

std::string dumps(const Value& value) { return Pickler().run(value); }

}  // namespace bridge::utils::pickle
