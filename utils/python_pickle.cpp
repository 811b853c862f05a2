// The pickle machine (Python's Lib/pickle.py _Unpickler, opcode for opcode) over a generic value tree, and a
// protocol-4 writer of the same tree. Every length is checked against the bytes that remain before anything is
// allocated, so a damaged file fails with the offset of the bad opcode rather than a huge allocation.
#include "utils/python_pickle.h"

#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

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
// Reading

namespace {

std::string hex_byte(unsigned char byte) {
  constexpr char kDigits[] = "0123456789abcdef";
  return {kDigits[byte >> 4], kDigits[byte & 15]};
}

class Unpickler {
 public:
  explicit Unpickler(std::string_view bytes) : bytes_(bytes) {}

  Value run() {
    while (true) {
      if (at_ >= bytes_.size()) fail("the pickle ends without a STOP opcode");
      opcode_at_ = at_;
      opcode_ = static_cast<unsigned char>(bytes_[at_++]);
      if (step()) break;
    }
    if (!marks_.empty()) fail("STOP inside an unfinished MARK");
    if (stack_.size() != 1) fail("STOP with " + std::to_string(stack_.size()) + " values on the stack, not 1");
    return std::move(stack_.back());
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("pickle opcode 0x" + hex_byte(opcode_) + " at byte " + std::to_string(opcode_at_) + ": " +
                             what);
  }

  std::string_view take(uint64_t n) {
    if (n > bytes_.size() - at_) {
      fail("needs " + std::to_string(n) + " bytes, but " + std::to_string(bytes_.size() - at_) + " remain");
    }
    const std::string_view out = bytes_.substr(at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return out;
  }
  uint64_t little(int width) {
    const std::string_view raw = take(static_cast<uint64_t>(width));
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(raw[i]);
    return value;
  }
  std::string_view line() {
    const std::size_t end = bytes_.find('\n', at_);
    if (end == std::string_view::npos) fail("its text argument has no end of line");
    const std::string_view out = bytes_.substr(at_, end - at_);
    at_ = end + 1;
    return out;
  }

  Value pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the stack is empty");
    Value value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }
  Value& top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the stack is empty");
    return stack_.back();
  }
  std::vector<Value> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Value> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(mark)),
                             std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  // A two's-complement little-endian integer of `raw.size()` bytes, as LONG1/LONG4 store it.
  Value long_int(std::string_view raw) {
    if (raw.empty()) return Value(int64_t{0});
    const bool negative = static_cast<unsigned char>(raw.back()) >= 0x80;
    // Bytes beyond 8 must be pure sign extension.
    for (std::size_t i = 8; i < raw.size(); ++i) {
      if (static_cast<unsigned char>(raw[i]) != (negative ? 0xff : 0x00)) {
        fail("the integer has " + std::to_string(raw.size()) + " bytes and does not fit in 64 bits");
      }
    }
    uint64_t value = negative ? ~uint64_t{0} : 0;
    const std::size_t n = std::min<std::size_t>(raw.size(), 8);
    for (std::size_t i = 0; i < n; ++i) {
      value &= ~(uint64_t{0xff} << (8 * i));
      value |= uint64_t{static_cast<unsigned char>(raw[i])} << (8 * i);
    }
    if (raw.size() > 8 && ((value >> 63) != 0) != negative) fail("the integer does not fit in 64 bits");
    return Value(static_cast<int64_t>(value));
  }

  int64_t text_int(std::string_view text) {
    if (!text.empty() && text.back() == 'L') text.remove_suffix(1);  // protocol 0's LONG
    try {
      std::size_t used = 0;
      const int64_t value = std::stoll(std::string(text), &used, 10);
      if (used != text.size()) fail("'" + std::string(text) + "' is not an integer");
      return value;
    } catch (const std::logic_error&) {
      fail("'" + std::string(text) + "' is not a 64-bit integer");
    }
  }

  void memo_put(uint64_t index) {
    if (stack_.empty()) fail("nothing on the stack to memoize");
    memo_[index] = stack_.back();
  }
  void memo_get(uint64_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) fail("memo entry " + std::to_string(index) + " was never stored");
    stack_.push_back(found->second);
  }

  Global global_of(const Value& module, const Value& name) {
    if (!module.is_str() || !name.is_str()) fail("STACK_GLOBAL needs two strs");
    return Global{module.as_str(), name.as_str()};
  }

  Value call(const Value& callable, std::vector<Value> args, Object::Made made) {
    if (!callable.is_global()) fail("calls " + callable.type_name() + ", not a global");
    auto object = std::make_shared<Object>();
    object->type = callable.global();
    object->made = made;
    object->args = std::move(args);
    return Value(std::move(object));
  }

  std::vector<Value> tuple_of(const Value& value) {
    if (!value.is_tuple()) fail("expects a tuple of arguments, got " + value.type_name());
    return value.tuple_items();
  }

  void set_items(Value& target, std::vector<Value> items) {
    if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
    if (!target.is_dict()) fail("sets items on " + target.type_name() + ", not a dict");
    auto& dict = target.dict().items;
    for (std::size_t i = 0; i < items.size(); i += 2) {
      // Python's dict keeps the first key's position and the last value.
      bool replaced = false;
      for (auto& [k, v] : dict) {
        if (k == items[i]) {
          v = std::move(items[i + 1]);
          replaced = true;
          break;
        }
      }
      if (!replaced) dict.emplace_back(std::move(items[i]), std::move(items[i + 1]));
    }
  }

  // Python's dicts hash their keys; a linear scan per item would make a dict of n items cost n^2. Keys of DCP's
  // dicts are distinct, so the scan above only runs for small dicts; larger ones append (a later duplicate key
  // then stays as a second entry, which no pickler writes).
  void set_items_fast(Value& target, std::vector<Value> items) {
    if (!target.is_dict()) fail("sets items on " + target.type_name() + ", not a dict");
    if (target.dict().items.size() + items.size() / 2 <= 64) return set_items(target, std::move(items));
    if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
    auto& dict = target.dict().items;
    for (std::size_t i = 0; i < items.size(); i += 2) dict.emplace_back(std::move(items[i]), std::move(items[i + 1]));
  }

  void append(Value& target, std::vector<Value> items) {
    if (target.is_list()) {
      auto& list = target.list_items();
      for (Value& item : items) list.push_back(std::move(item));
      return;
    }
    // A set under construction (EMPTY_SET / ADDITEMS) keeps its items as its one argument, a list.
    if (target.is_object() && target.object().made == Object::Made::kReduce &&
        target.object().type.module == "builtins" && target.object().type.name == "set" &&
        target.object().args.size() == 1) {
      auto& list = target.object().args[0].list_items();
      for (Value& item : items) list.push_back(std::move(item));
      return;
    }
    fail("appends to " + target.type_name() + ", not a list");
  }

  // Runs the opcode just read; returns true at STOP.
  bool step() {
    switch (opcode_) {
      case 0x80:  // PROTO
        if (static_cast<unsigned char>(take(1)[0]) > 5) fail("protocol above 5");
        return false;
      case 0x95:  // FRAME: a length prefix for buffered readers; the content follows as ordinary opcodes
        little(8);
        return false;
      case '.':  // STOP
        return true;
      case '(':  // MARK
        marks_.push_back(stack_.size());
        return false;
      case '0':  // POP
        pop();
        return false;
      case '1':  // POP_MARK
        pop_mark();
        return false;
      case '2':  // DUP
        stack_.push_back(top());
        return false;
      case 'N':
        stack_.emplace_back();
        return false;
      case 0x88:
        stack_.emplace_back(true);
        return false;
      case 0x89:
        stack_.emplace_back(false);
        return false;
      case 'I': {  // INT (protocol 0): also True/False as 01/00
        const std::string_view text = line();
        if (text == "01" || text == "00") {
          stack_.emplace_back(text == "01");
        } else {
          stack_.emplace_back(text_int(text));
        }
        return false;
      }
      case 'L':
        stack_.emplace_back(text_int(line()));
        return false;
      case 'J':
        stack_.emplace_back(static_cast<int64_t>(static_cast<int32_t>(little(4))));
        return false;
      case 'K':
        stack_.emplace_back(static_cast<int64_t>(little(1)));
        return false;
      case 'M':
        stack_.emplace_back(static_cast<int64_t>(little(2)));
        return false;
      case 0x8a:  // LONG1
        stack_.push_back(long_int(take(little(1))));
        return false;
      case 0x8b: {  // LONG4
        const auto n = static_cast<int32_t>(little(4));
        if (n < 0) fail("negative length");
        stack_.push_back(long_int(take(static_cast<uint64_t>(n))));
        return false;
      }
      case 'G': {  // BINFLOAT, big-endian
        const std::string_view raw = take(8);
        uint64_t bits = 0;
        for (const char c : raw) bits = bits << 8 | static_cast<unsigned char>(c);
        double value = 0;
        std::memcpy(&value, &bits, sizeof value);
        stack_.emplace_back(value);
        return false;
      }
      case 'F': {  // FLOAT (protocol 0)
        const std::string text(line());
        try {
          stack_.emplace_back(std::stod(text));
        } catch (const std::logic_error&) {
          fail("'" + text + "' is not a float");
        }
        return false;
      }
      case 0x8c:  // SHORT_BINUNICODE
        stack_.emplace_back(std::string(take(little(1))));
        return false;
      case 'X':  // BINUNICODE
        stack_.emplace_back(std::string(take(little(4))));
        return false;
      case 0x8d:  // BINUNICODE8
        stack_.emplace_back(std::string(take(little(8))));
        return false;
      case 'V':  // UNICODE (protocol 0, raw-unicode-escape: ASCII text reads as itself)
        stack_.emplace_back(std::string(line()));
        return false;
      case 'U':  // SHORT_BINSTRING, 'T' BINSTRING: Python 2 str, which Python 3 decodes as str (ASCII)
        stack_.emplace_back(std::string(take(little(1))));
        return false;
      case 'T': {
        const auto n = static_cast<int32_t>(little(4));
        if (n < 0) fail("negative length");
        stack_.emplace_back(std::string(take(static_cast<uint64_t>(n))));
        return false;
      }
      case 'C':  // SHORT_BINBYTES
        stack_.emplace_back(Bytes{std::string(take(little(1)))});
        return false;
      case 'B':  // BINBYTES
        stack_.emplace_back(Bytes{std::string(take(little(4)))});
        return false;
      case 0x8e:  // BINBYTES8
      case 0x96:  // BYTEARRAY8
        stack_.emplace_back(Bytes{std::string(take(little(8)))});
        return false;
      case ')':
        stack_.push_back(Value::tuple({}));
        return false;
      case 't':
        stack_.push_back(Value::tuple(pop_mark()));
        return false;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const std::size_t n = opcode_ - 0x84;
        std::vector<Value> items(n);
        for (std::size_t i = n; i-- > 0;) items[i] = pop();
        stack_.push_back(Value::tuple(std::move(items)));
        return false;
      }
      case ']':
        stack_.push_back(Value::list({}));
        return false;
      case 'l':
        stack_.push_back(Value::list(pop_mark()));
        return false;
      case 'a': {  // APPEND
        Value item = pop();
        append(top(), {std::move(item)});
        return false;
      }
      case 'e': {  // APPENDS
        std::vector<Value> items = pop_mark();
        append(top(), std::move(items));
        return false;
      }
      case '}':
        stack_.push_back(Value::dict({}));
        return false;
      case 'd': {
        Value dict = Value::dict({});
        set_items_fast(dict, pop_mark());
        stack_.push_back(std::move(dict));
        return false;
      }
      case 's': {  // SETITEM
        Value value = pop();
        Value key = pop();
        set_items_fast(top(), {std::move(key), std::move(value)});
        return false;
      }
      case 'u': {  // SETITEMS
        std::vector<Value> items = pop_mark();
        set_items_fast(top(), std::move(items));
        return false;
      }
      case 0x8f:  // EMPTY_SET: builtins.set([...])
        stack_.push_back(reduce(Global{"builtins", "set"}, {Value::list({})}));
        return false;
      case 0x90: {  // ADDITEMS
        std::vector<Value> items = pop_mark();
        append(top(), std::move(items));
        return false;
      }
      case 0x91:  // FROZENSET
        stack_.push_back(reduce(Global{"builtins", "frozenset"}, {Value::list(pop_mark())}));
        return false;
      case 'c': {  // GLOBAL: module and name, one line each
        std::string module(line());
        std::string name(line());
        stack_.emplace_back(Global{std::move(module), std::move(name)});
        return false;
      }
      case 0x93: {  // STACK_GLOBAL
        const Value name = pop();
        const Value module = pop();
        stack_.emplace_back(global_of(module, name));
        return false;
      }
      case 'R': {  // REDUCE
        const Value args = pop();
        const Value callable = pop();
        stack_.push_back(call(callable, tuple_of(args), Object::Made::kReduce));
        return false;
      }
      case 0x81: {  // NEWOBJ
        const Value args = pop();
        const Value cls = pop();
        stack_.push_back(call(cls, tuple_of(args), Object::Made::kNewObj));
        return false;
      }
      case 0x92: {  // NEWOBJ_EX
        Value kwargs = pop();
        const Value args = pop();
        const Value cls = pop();
        if (!kwargs.is_dict()) fail("NEWOBJ_EX expects a dict of keyword arguments, got " + kwargs.type_name());
        Value made = call(cls, tuple_of(args), Object::Made::kNewObj);
        made.object().kwargs = kwargs.dict().items;
        stack_.push_back(std::move(made));
        return false;
      }
      case 'b': {  // BUILD
        Value state = pop();
        Value& target = top();
        if (!target.is_object()) fail("BUILD on " + target.type_name() + ", not an object");
        target.object().state = std::move(state);
        return false;
      }
      case 'Q': {  // BINPERSID
        Value pid = pop();
        auto object = std::make_shared<Object>();
        object->made = Object::Made::kPersistentId;
        object->args.push_back(std::move(pid));
        stack_.emplace_back(std::move(object));
        return false;
      }
      case 'P': {  // PERSID
        auto object = std::make_shared<Object>();
        object->made = Object::Made::kPersistentId;
        object->args.emplace_back(std::string(line()));
        stack_.emplace_back(std::move(object));
        return false;
      }
      case 0x94:  // MEMOIZE
        memo_put(memo_.size());
        return false;
      case 'q':
        memo_put(little(1));
        return false;
      case 'r':
        memo_put(little(4));
        return false;
      case 'p':
        memo_put(static_cast<uint64_t>(text_int(line())));
        return false;
      case 'h':
        memo_get(little(1));
        return false;
      case 'j':
        memo_get(little(4));
        return false;
      case 'g':
        memo_get(static_cast<uint64_t>(text_int(line())));
        return false;
      default:
        fail("not an opcode this reader knows (extensions, INST/OBJ and out-of-band buffers are not supported)");
    }
  }

  std::string_view bytes_;
  std::size_t at_ = 0;
  std::size_t opcode_at_ = 0;
  unsigned char opcode_ = 0;
  std::vector<Value> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, Value> memo_;
};

}  // namespace

Value loads(std::string_view bytes) { return Unpickler(bytes).run(); }

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
