// The pickle machine (Python's Lib/pickle.py _Unpickler, opcode for opcode) over the generic value tree of
// python_pickle.h. Every length is checked against the bytes that remain before anything is allocated, so a damaged
// file fails with the offset of the bad opcode rather than a huge allocation.
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "utils/python_pickle.h"

namespace bridge::utils::pickle {

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

}  // namespace bridge::utils::pickle
