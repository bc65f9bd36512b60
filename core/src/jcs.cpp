#include "idem/jcs.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

// Two passes. The parser validates the input and builds a flat tree whose scalars point at their
// canonical text: in the input itself when it is already canonical (strings without escapes,
// literals, most numbers), otherwise in a side buffer. Objects sort their members when they
// close. The writer then copies every byte once into an output of exactly the right size, so
// the work stays linear however deeply unsorted objects nest.

namespace idem {
namespace {

// For the few small functions on the per-token path that GCC otherwise leaves as calls.
#define IDEM_HOT [[gnu::always_inline]] inline

constexpr int kMaxDepth = 512;
// Offsets are 32-bit; numbers can grow about 5x when canonicalised ("1e20"), so this keeps
// every offset and size far from overflowing.
constexpr std::size_t kMaxInput = std::size_t{256} << 20;

enum class Kind : std::uint32_t {
  input,   // text in the input
  side,    // text in the side buffer
  keys,    // text in the decoded-names buffer
  array,   // a container: `off` indexes elements_, `len` counts them
  object,  // a container: `off` indexes members_, `len` counts them
  failed,  // no value: parsing failed
};

// Where some text is (or a container's children are); 8 bytes, as there is one per value.
// One 64-bit field, so it is written and read whole: built from two 32-bit halves, it would
// be stored as two and loaded as one, which stalls store-to-load forwarding.
struct Text {
  std::uint64_t bits = 0;  // off | len << 35 | kind << 32

  static constexpr Text make(Kind kind, std::size_t off, std::size_t len) {
    return Text{static_cast<std::uint64_t>(off) | static_cast<std::uint64_t>(kind) << 32 |
                static_cast<std::uint64_t>(len) << 35};
  }
  std::uint32_t off() const { return static_cast<std::uint32_t>(bits); }
  Kind kind() const { return static_cast<Kind>((bits >> 32) & 7); }
  std::uint32_t len() const { return static_cast<std::uint32_t>(bits >> 35); }
};

// A parsed value, held by its parent (no node table: scalars cost no indirection).
struct Node {
  Text text;               // scalars: their canonical text; containers: their children
  std::uint32_t size = 0;  // length of the canonical form

  bool ok() const { return text.kind() != Kind::failed; }
};

// What the parsing functions return on failure, having recorded the error.
constexpr Node kFailed{Text::make(Kind::failed, 0, 0), 0};

// A member while its object is being parsed.
struct Member {
  std::uint64_t prefix = 0;  // the name's first 8 bytes, ordered like UTF-16; see name_prefix
  Text name;                 // decoded (UTF-8), for ordering and JSON Pointer matching
  Text name_out;             // canonical, with quotes
  Node value;
  std::uint32_t at = 0;      // input offset of the name, for errors
  bool excluded = false;
};

// A member being sorted: its name's prefix and its place in the object.
struct Order {
  std::uint64_t prefix;
  std::uint32_t index;
};

// A member of a closed object, in canonical order.
struct Entry {
  Text name_out;
  Node value;
};

struct PointerToken {
  std::string text;
  std::size_t index = 0;  // the array index this token denotes, if is_index
  bool is_index = false;
};

// Maps a byte of UTF-8 so that bytewise order becomes UTF-16 code-unit order: only the lead
// bytes of U+E000..U+FFFF (0xEE, 0xEF) must move above those of the supplementary planes
// (0xF0..0xF4), whose surrogates (0xD800..) sort below U+E000 in UTF-16.
inline unsigned utf16_rank(unsigned char c) { return (c == 0xEE || c == 0xEF) ? c + 0x10u : c; }

// Strict weak order of valid UTF-8 strings by their UTF-16 code units (RFC 8785 §3.2.3). The
// first differing byte is at the same position of a code point in both strings, so comparing
// it (remapped) decides.
bool utf16_less(std::string_view a, std::string_view b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      return utf16_rank(static_cast<unsigned char>(a[i])) <
             utf16_rank(static_cast<unsigned char>(b[i]));
    }
  }
  return a.size() < b.size();
}

// The first 8 bytes of a name, zero-padded, remapped by utf16_rank and read big-endian: if
// two prefixes differ they order the names as utf16_less does; if equal, compare in full.
// `readable` says whether 8 bytes may be read at `name.data()` even if the name is shorter.
// Built in a register: going through a byte buffer on the stack stalls store forwarding.
IDEM_HOT std::uint64_t name_prefix(std::string_view name, bool readable) {
  const std::size_t n = std::min<std::size_t>(name.size(), 8);
  std::uint64_t w = 0;
  if (readable && std::endian::native == std::endian::little) {
    std::memcpy(&w, name.data(), 8);
    if (n < 8) w &= (std::uint64_t{1} << (8 * n)) - 1;
    if ((w & 0x8080808080808080ull) == 0) return std::byteswap(w);
  }
  w = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    const unsigned c = i < n ? utf16_rank(static_cast<unsigned char>(name[i])) : 0;
    w = w << 8 | c;
  }
  return w;
}

// Length of the valid UTF-8 sequence at p (RFC 3629: no overlongs, no surrogates, at most
// U+10FFFF), or 0.
inline std::size_t utf8_sequence(const unsigned char* p, std::size_t avail) {
  const unsigned c = p[0];
  auto cont = [&](std::size_t i) { return (p[i] & 0xC0u) == 0x80u; };
  if (c < 0xC2) return 0;
  if (c < 0xE0) return avail >= 2 && cont(1) ? 2 : 0;
  if (c < 0xF0) {
    if (avail < 3) return 0;
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return p[1] >= lo && p[1] <= hi && cont(2) ? 3 : 0;
  }
  if (c < 0xF5) {
    if (avail < 4) return 0;
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return p[1] >= lo && p[1] <= hi && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Appends the RFC 8785 escape of an ASCII character that needs one, or the character itself.
void append_escaped_ascii(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  switch (c) {
    case '"': out += "\\\""; return;
    case '\\': out += "\\\\"; return;
    case '\b': out += "\\b"; return;
    case '\f': out += "\\f"; return;
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    default:
      if (c < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
        out.append(esc, sizeof esc);
      } else {
        out += static_cast<char>(c);
      }
  }
}

// A JSON string literal for valid UTF-8 `s`, escaped as RFC 8785 does; for error messages.
std::string quoted(std::string_view s) {
  constexpr std::size_t kMax = 64;
  std::string out = "\"";
  std::size_t i = 0;
  while (i < s.size() && i < kMax) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      append_escaped_ascii(out, c);
      ++i;
    } else {
      const std::size_t n = std::max<std::size_t>(
          1, utf8_sequence(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i));
      out.append(s.substr(i, n));
      i += n;
    }
  }
  if (i < s.size()) out += "...";
  out += '"';
  return out;
}

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

inline int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Flags (high bit of the byte) the bytes of `w` that a string scan must look at: quotes,
// backslashes, control characters, non-ASCII. Borrows can flag bytes above a flagged one, never
// below, so the lowest flag is exact.
inline std::uint64_t attention_mask(std::uint64_t w) {
  constexpr std::uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
  const std::uint64_t quote = w ^ (ones * '"'), backslash = w ^ (ones * '\\');
  const std::uint64_t zero_quote = (quote - ones) & ~quote;
  const std::uint64_t zero_backslash = (backslash - ones) & ~backslash;
  const std::uint64_t control = w - ones * 0x20;
  return (zero_quote | zero_backslash | control | w) & highs;
}

// Writes `value` (finite) as ECMAScript's Number::toString into buf[0..32); returns the length.
std::size_t format_number(double value, char* buf) {
  if (value == 0) {  // also -0
    buf[0] = '0';
    return 1;
  }
  // Shortest round-trip digits (the closest of them on ties, as ECMAScript requires), then
  // ECMAScript's layout rules (ECMA-262 Number::toString, steps 5-12).
  char sci[32];
  const auto r = std::to_chars(sci, sci + sizeof sci, value, std::chars_format::scientific);
  const char* p = sci;
  char* o = buf;
  if (*p == '-') *o++ = *p++;
  char digits[20];
  int k = 0;
  digits[k++] = *p++;
  if (*p == '.') {
    ++p;
    while (*p != 'e') digits[k++] = *p++;
  }
  ++p;  // 'e'
  const bool exp_negative = *p == '-';
  ++p;  // to_chars always writes the exponent's sign
  int e = 0;
  std::from_chars(p, r.ptr, e);
  const int n = (exp_negative ? -e : e) + 1;  // the decimal point sits after n digits
  if (k <= n && n <= 21) {
    std::memcpy(o, digits, k);
    o += k;
    std::memset(o, '0', n - k);
    o += n - k;
  } else if (0 < n && n <= 21) {
    std::memcpy(o, digits, n);
    o += n;
    *o++ = '.';
    std::memcpy(o, digits + n, k - n);
    o += k - n;
  } else if (-6 < n && n <= 0) {
    *o++ = '0';
    *o++ = '.';
    std::memset(o, '0', -n);
    o += -n;
    std::memcpy(o, digits, k);
    o += k;
  } else {
    *o++ = digits[0];
    if (k > 1) {
      *o++ = '.';
      std::memcpy(o, digits + 1, k - 1);
      o += k - 1;
    }
    *o++ = 'e';
    *o++ = n - 1 < 0 ? '-' : '+';
    o = std::to_chars(o, buf + 32, n - 1 < 0 ? 1 - n : n - 1).ptr;
  }
  return static_cast<std::size_t>(o - buf);
}

// A growable array of trivially copyable values whose append is a store and an increment: the
// per-token path appends to several of these, and std::vector's append is not inlined there.
template <class T>
class PodStack {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  void clear() { size_ = 0; }
  void shrink(std::size_t n) { size_ = n; }  // n <= size()

  IDEM_HOT T& push(const T& value) {
    if (size_ == capacity_) [[unlikely]] grow(size_ + 1);
    data_[size_] = value;
    return data_[size_++];
  }
  // A new last element, left for the caller to fill in.
  IDEM_HOT T& push_uninitialized() {
    if (size_ == capacity_) [[unlikely]] grow(size_ + 1);
    return data_[size_++];
  }
  void append(const T* first, std::size_t n) {
    if (size_ + n > capacity_) grow(size_ + n);
    if (n > 0) std::memcpy(data_.get() + size_, first, n * sizeof(T));
    size_ += n;
  }

 private:
  [[gnu::noinline]] void grow(std::size_t needed) {
    const std::size_t capacity = std::max({needed, capacity_ * 2, std::size_t{64}});
    auto data = std::make_unique_for_overwrite<T[]>(capacity);
    if (size_ > 0) std::memcpy(data.get(), data_.get(), size_ * sizeof(T));
    data_ = std::move(data);
    capacity_ = capacity;
  }

  std::unique_ptr<T[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

// The parser's working memory. Kept per thread between calls: allocating it afresh costs more
// than the parsing (the allocator hands large blocks back to the kernel and page-faults them in
// again on every request).
struct Scratch {
  std::string side;  // canonical text of scalars the input does not already hold
  std::string keys;  // decoded names that had escapes
  PodStack<Member> member_stack;  // members of the objects being parsed
  PodStack<Entry> members;        // members of closed objects, each object's sorted
  PodStack<Node> element_stack;
  PodStack<Node> elements;
  PodStack<Order> order;  // sorting an object's members
  std::vector<std::vector<PointerToken>> pointers;
  std::vector<std::uint32_t> active;  // stacked sets of pointers still matching

  // Empties the buffers; frees them after an unusually large input.
  void reset() {
    constexpr std::size_t kKeep = std::size_t{1} << 20;
    const std::size_t held = side.capacity() + keys.capacity() +
                             member_stack.capacity() * sizeof(Member) +
                             members.capacity() * sizeof(Entry) +
                             (element_stack.capacity() + elements.capacity()) * sizeof(Node);
    if (held > kKeep) {
      *this = Scratch();
      return;
    }
    side.clear();
    keys.clear();
    member_stack.clear();
    members.clear();
    element_stack.clear();
    elements.clear();
    pointers.clear();
    active.clear();
  }
};

// Copies text of at most 16 bytes with one fixed-size move when both ends have room for it.
IDEM_HOT void copy_text(char*& p, const char* src, std::size_t len, bool src_padded) {
  if (len <= 16 && src_padded) {
    std::memcpy(p, src, 16);
  } else {
    std::memcpy(p, src, len);
  }
  p += len;
}

class Parser {
 public:
  Parser(std::string_view input, std::span<const std::string> exclude, Scratch& scratch)
      : in_(input.data()), n_(input.size()), scratch_(scratch) {
    scratch_.reset();
    for (const std::string& pointer : exclude) add_pointer(pointer);
  }
  ~Parser() { scratch_.reset(); }
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  std::expected<std::string, JsonError> run() {
    if (n_ > kMaxInput) return std::unexpected(JsonError{"input larger than 256 MiB", 0});
    for (std::uint32_t i = 0; i < pointers_.size(); ++i) active_.push_back(i);
    skip_ws();
    const Node root = value(0, 0, static_cast<std::uint32_t>(active_.size()));
    if (!root.ok()) {
      return std::unexpected(std::move(error_));
    }
    skip_ws();
    if (pos_ != n_) {
      fail(pos_, "unexpected data after the JSON value");
      return std::unexpected(std::move(error_));
    }
    // Room for copy_text's fixed-size moves past the last byte of each buffer.
    side_.append(16, '\0');
    keys_.append(16, '\0');
    const std::size_t size = root.size;
    std::string out;
    out.resize_and_overwrite(size + 16, [&](char* p, std::size_t) {
      write(root, p);
      return size;
    });
    return out;
  }

 private:
  bool fail(std::size_t at, std::string message) {
    error_ = JsonError{std::move(message), at};
    return false;
  }

  // A failed parse, as a value: fail() and a node that says so.
  Node failed(std::size_t at, std::string message) {
    fail(at, std::move(message));
    return kFailed;
  }

  Node failed_unexpected(std::size_t at) {
    fail_unexpected(at);
    return kFailed;
  }

  bool fail_unexpected(std::size_t at) {
    if (at >= n_) return fail(at, "unexpected end of input");
    const auto c = static_cast<unsigned char>(in_[at]);
    if (c > 0x20 && c < 0x7F) return fail(at, std::string("unexpected '") + in_[at] + "'");
    static constexpr char kHex[] = "0123456789ABCDEF";
    return fail(at, std::string("unexpected byte 0x") + kHex[c >> 4] + kHex[c & 0xF]);
  }

  // An RFC 6901 pointer; malformed ones (no leading '/', a '~' not followed by 0 or 1) and ""
  // (the whole document, which cannot be left out of itself) match nothing, so are dropped.
  void add_pointer(std::string_view pointer) {
    if (pointer.empty() || pointer[0] != '/') return;
    std::vector<PointerToken> tokens;
    std::size_t i = 1;
    for (;;) {
      const std::size_t end = std::min(pointer.find('/', i), pointer.size());
      PointerToken token;
      for (std::size_t j = i; j < end; ++j) {
        if (pointer[j] != '~') {
          token.text += pointer[j];
        } else if (j + 1 < end && (pointer[j + 1] == '0' || pointer[j + 1] == '1')) {
          token.text += pointer[++j] == '0' ? '~' : '/';
        } else {
          return;
        }
      }
      const std::string& t = token.text;
      if (!t.empty() && t.size() <= 18 && std::all_of(t.begin(), t.end(), is_digit) &&
          (t.size() == 1 || t[0] != '0')) {
        token.is_index = true;
        std::from_chars(t.data(), t.data() + t.size(), token.index);
      }
      tokens.push_back(std::move(token));
      if (end == pointer.size()) break;
      i = end + 1;
    }
    pointers_.push_back(std::move(tokens));
  }

  const char* base(Kind kind) const {
    switch (kind) {
      case Kind::input: return in_;
      case Kind::side: return side_.data();
      default: return keys_.data();
    }
  }

  std::string_view view(Text t) const { return {base(t.kind()) + t.off(), t.len()}; }

  IDEM_HOT void skip_ws() {
    if (pos_ < n_ && static_cast<unsigned char>(in_[pos_]) > ' ') [[likely]] return;
    while (pos_ < n_) {
      const char c = in_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
      ++pos_;
    }
  }

  static Node make_node(Text text, std::uint64_t size) {
    return Node{text, static_cast<std::uint32_t>(size)};
  }

  // `active_[act_begin, act_end)` are the pointers whose first `depth` tokens lead here.
  IDEM_HOT Node value(int depth, std::uint32_t act_begin, std::uint32_t act_end) {
    if (pos_ >= n_) return failed(pos_, "unexpected end of input");
    const char c = in_[pos_];
    if (c == '"') {
      Text text;
      if (!string(text, nullptr)) return kFailed;
      return make_node(text, text.len());
    }
    if (c == '-' || is_digit(c)) return number();
    switch (c) {
      case '{': return object(depth, act_begin, act_end);
      case '[': return array(depth, act_begin, act_end);
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default: return failed_unexpected(pos_);
    }
  }

  Node literal(std::string_view word) {
    if (n_ - pos_ < word.size() || std::memcmp(in_ + pos_, word.data(), word.size()) != 0) {
      return failed_unexpected(pos_);
    }
    const Node node = make_node(Text::make(Kind::input, pos_, word.size()), word.size());
    pos_ += word.size();
    return node;
  }

  Node object(int depth, std::uint32_t act_begin, std::uint32_t act_end) {
    if (depth >= kMaxDepth) return failed(pos_, "nesting deeper than 512 levels");
    ++pos_;
    const std::size_t mark = member_stack_.size();
    skip_ws();
    if (pos_ < n_ && in_[pos_] == '}') {
      ++pos_;
      return make_node(Text::make(Kind::object, 0, 0), 2);
    }
    for (;;) {
      if (pos_ >= n_ || in_[pos_] != '"') {
        if (pos_ >= n_) return failed(pos_, "unexpected end of input");
        return failed(pos_, "expected a string as object key");
      }
      Member& m = member_stack_.push_uninitialized();
      m.at = static_cast<std::uint32_t>(pos_);
      m.excluded = false;
      if (!string(m.name_out, &m.name)) return kFailed;
      const std::string_view name = view(m.name);
      m.prefix = name_prefix(name, m.name.kind() == Kind::input && m.name.off() + 8 <= n_);
      skip_ws();
      if (pos_ >= n_ || in_[pos_] != ':') {
        if (pos_ >= n_) return failed(pos_, "unexpected end of input");
        return failed(pos_, "expected ':' after object key");
      }
      ++pos_;
      skip_ws();
      bool excluded = false;
      std::uint32_t child_begin = 0, child_end = 0;
      if (act_begin != act_end) [[unlikely]] {
        child_begin = static_cast<std::uint32_t>(active_.size());
        for (std::uint32_t i = act_begin; i < act_end; ++i) {
          const std::uint32_t p = active_[i];
          const std::vector<PointerToken>& tokens = pointers_[p];
          if (tokens[depth].text != name) continue;
          if (tokens.size() == static_cast<std::size_t>(depth) + 1) {
            excluded = true;
          } else {
            active_.push_back(p);
          }
        }
        if (excluded) active_.resize(child_begin);
        child_end = static_cast<std::uint32_t>(active_.size());
      }
      const std::size_t index = member_stack_.size() - 1;  // `m` may move while the value parses
      const Node child = value(depth + 1, child_begin, child_end);
      if (child_end != child_begin) active_.resize(child_begin);
      if (!child.ok()) return kFailed;
      member_stack_[index].value = child;
      member_stack_[index].excluded = excluded;
      skip_ws();
      if (pos_ < n_ && in_[pos_] == ',') {
        ++pos_;
        skip_ws();
        continue;
      }
      if (pos_ < n_ && in_[pos_] == '}') {
        ++pos_;
        break;
      }
      if (pos_ >= n_) return failed(pos_, "unexpected end of input");
      return failed(pos_, "expected ',' or '}' in object");
    }
    return close_object(mark);
  }

  // -1, 0 or 1 as member a's name orders before, like or after b's, in UTF-16 code units.
  int compare_names(const Member& a, const Member& b) const {
    if (a.prefix != b.prefix) return a.prefix < b.prefix ? -1 : 1;
    const std::string_view x = view(a.name), y = view(b.name);
    if (x == y) return 0;
    return utf16_less(x, y) ? -1 : 1;
  }

  IDEM_HOT bool before(const Order& a, const Order& b, const Member* members) const {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    return compare_names(members[a.index], members[b.index]) < 0;
  }

  Node close_object(std::size_t mark) {
    const std::size_t count = member_stack_.size() - mark;
    const Member* members = member_stack_.data() + mark;
    const auto off = static_cast<std::uint32_t>(members_.size());
    std::uint64_t size = 2;
    std::uint32_t kept = 0;
    auto keep = [&](const Member& m) {
      if (m.excluded) return;
      members_.push(Entry{m.name_out, m.value});
      size += m.name_out.len() + 1 + m.value.size + (kept > 0 ? 1 : 0);
      ++kept;
    };
    // Bodies often arrive sorted already (canonical clients, re-sent requests).
    std::size_t sorted = 1;
    while (sorted < count && compare_names(members[sorted - 1], members[sorted]) < 0) ++sorted;
    if (sorted >= count) {
      for (std::size_t i = 0; i < count; ++i) keep(members[i]);
    } else {
      // Sorts (prefix, index) pairs: most names differ in their first 8 bytes, so most
      // comparisons are one integer comparison. Objects are usually small: insertion sort.
      PodStack<Order>& order = scratch_.order;
      order.clear();
      for (std::uint32_t i = 0; i < count; ++i) order.push(Order{members[i].prefix, i});
      Order* items = order.data();
      if (count <= 32) {
        for (std::size_t i = 1; i < count; ++i) {
          const Order item = items[i];
          std::size_t j = i;
          for (; j > 0 && before(item, items[j - 1], members); --j) items[j] = items[j - 1];
          items[j] = item;
        }
      } else {
        std::sort(items, items + count,
                  [&](const Order& a, const Order& b) { return before(a, b, members); });
      }
      // Report the duplicate the reader meets first: the earliest second occurrence.
      const Member* dup = nullptr;
      std::uint32_t dup_at = 0;
      for (std::size_t i = 0; i + 1 < count; ++i) {
        const Member& a = members[order[i].index];
        const Member& b = members[order[i + 1].index];
        if (compare_names(a, b) != 0) continue;
        const std::uint32_t at = std::max(a.at, b.at);
        if (dup == nullptr || at < dup_at) {
          dup = &a;
          dup_at = at;
        }
      }
      if (dup != nullptr) {
        return failed(dup_at, "duplicate object key " + quoted(view(dup->name)));
      }
      for (std::size_t i = 0; i < count; ++i) keep(members[order[i].index]);
    }
    member_stack_.shrink(mark);
    if (size > std::numeric_limits<std::uint32_t>::max()) {
      return failed(pos_, "canonical form larger than 4 GiB");
    }
    return make_node(Text::make(Kind::object, off, kept), size);
  }

  Node array(int depth, std::uint32_t act_begin, std::uint32_t act_end) {
    if (depth >= kMaxDepth) return failed(pos_, "nesting deeper than 512 levels");
    ++pos_;
    const std::size_t mark = element_stack_.size();
    skip_ws();
    if (pos_ < n_ && in_[pos_] == ']') {
      ++pos_;
      return make_node(Text::make(Kind::array, 0, 0), 2);
    }
    std::uint64_t size = 2;
    for (std::size_t index = 0;; ++index) {
      bool excluded = false;
      std::uint32_t child_begin = 0, child_end = 0;
      if (act_begin != act_end) [[unlikely]] {
        child_begin = static_cast<std::uint32_t>(active_.size());
        for (std::uint32_t i = act_begin; i < act_end; ++i) {
          const std::uint32_t p = active_[i];
          const std::vector<PointerToken>& tokens = pointers_[p];
          const PointerToken& token = tokens[depth];
          if (!token.is_index || token.index != index) continue;
          if (tokens.size() == static_cast<std::size_t>(depth) + 1) {
            excluded = true;
          } else {
            active_.push_back(p);
          }
        }
        if (excluded) active_.resize(child_begin);
        child_end = static_cast<std::uint32_t>(active_.size());
      }
      const Node child = value(depth + 1, child_begin, child_end);
      if (child_end != child_begin) active_.resize(child_begin);
      if (!child.ok()) return kFailed;
      if (!excluded) {
        size += child.size + (element_stack_.size() > mark ? 1 : 0);
        element_stack_.push(child);
      }
      skip_ws();
      if (pos_ < n_ && in_[pos_] == ',') {
        ++pos_;
        skip_ws();
        continue;
      }
      if (pos_ < n_ && in_[pos_] == ']') {
        ++pos_;
        break;
      }
      if (pos_ >= n_) return failed(pos_, "unexpected end of input");
      return failed(pos_, "expected ',' or ']' in array");
    }
    const auto off = static_cast<std::uint32_t>(elements_.size());
    const std::size_t count = element_stack_.size() - mark;
    elements_.append(element_stack_.data() + mark, count);
    element_stack_.shrink(mark);
    if (size > std::numeric_limits<std::uint32_t>::max()) {
      return failed(pos_, "canonical form larger than 4 GiB");
    }
    return make_node(Text::make(Kind::array, off, count), size);
  }

  // Parses the string at pos_ (a '"'). `out` receives its canonical form, quotes included;
  // `name`, if given, its decoded text.
  IDEM_HOT bool string(Text& out, Text* name) {
    const std::size_t begin = pos_;
    std::size_t i = pos_ + 1;
    const auto* u = reinterpret_cast<const unsigned char*>(in_);
    for (;;) {
      // Eight bytes at a time to the first byte that needs a look: the lowest flagged byte of
      // needs_attention's mask is always a real one.
      if constexpr (std::endian::native == std::endian::little) {
        while (i + 8 <= n_) {
          std::uint64_t w;
          std::memcpy(&w, in_ + i, 8);
          const std::uint64_t mask = attention_mask(w);
          if (mask != 0) {
            i += static_cast<std::size_t>(std::countr_zero(mask)) >> 3;
            break;
          }
          i += 8;
        }
      }
      if (i >= n_) return fail(n_, "unterminated string");
      const unsigned char c = u[i];
      if (c == '"') break;
      if (c == '\\') return escaped_string(begin, i, out, name);
      if (c < 0x20) return fail(i, "control character in string");
      if (c < 0x80) {
        ++i;
        continue;
      }
      const std::size_t len = utf8_sequence(u + i, n_ - i);
      if (len == 0) return fail(i, "invalid UTF-8 in string");
      i += len;
    }
    // Without escapes, the input is already the canonical form.
    out = Text::make(Kind::input, begin, i + 1 - begin);
    if (name != nullptr) *name = Text::make(Kind::input, begin + 1, i - begin - 1);
    pos_ = i + 1;
    return true;
  }

  // The rest of a string from its first backslash at `i`, decoding into the side buffer.
  bool escaped_string(std::size_t begin, std::size_t i, Text& out, Text* name) {
    const auto* u = reinterpret_cast<const unsigned char*>(in_);
    const std::size_t out_begin = side_.size();
    const std::size_t name_begin = keys_.size();
    side_.append(in_ + begin, i - begin);
    if (name != nullptr) keys_.append(in_ + begin + 1, i - begin - 1);
    for (;;) {
      if (i >= n_) return fail(n_, "unterminated string");
      const unsigned char c = u[i];
      if (c == '"') break;
      if (c == '\\') {
        std::uint32_t cp = 0;
        if (!escape(i, cp)) return false;
        if (cp < 0x80) {
          append_escaped_ascii(side_, static_cast<unsigned char>(cp));
        } else {
          append_utf8(side_, cp);
        }
        if (name != nullptr) append_utf8(keys_, cp);
        continue;
      }
      if (c < 0x20) return fail(i, "control character in string");
      std::size_t run = i;
      while (run < n_ && u[run] >= 0x20 && u[run] < 0x80 && u[run] != '"' && u[run] != '\\') ++run;
      if (run == i) {
        run += utf8_sequence(u + i, n_ - i);
        if (run == i) return fail(i, "invalid UTF-8 in string");
      }
      side_.append(in_ + i, run - i);
      if (name != nullptr) keys_.append(in_ + i, run - i);
      i = run;
    }
    side_ += '"';
    pos_ = i + 1;
    if (side_.size() > std::numeric_limits<std::uint32_t>::max() - 16 ||
        keys_.size() > std::numeric_limits<std::uint32_t>::max() - 16) {
      return fail(begin, "canonical form larger than 4 GiB");
    }
    out = Text::make(Kind::side, out_begin, side_.size() - out_begin);
    if (name != nullptr) *name = Text::make(Kind::keys, name_begin, keys_.size() - name_begin);
    return true;
  }

  // Decodes the escape at i (a backslash) into a code point and moves i past it.
  bool escape(std::size_t& i, std::uint32_t& cp) {
    if (i + 1 >= n_) return fail(n_, "unterminated string");
    const char c = in_[i + 1];
    switch (c) {
      case '"': cp = '"'; break;
      case '\\': cp = '\\'; break;
      case '/': cp = '/'; break;
      case 'b': cp = '\b'; break;
      case 'f': cp = '\f'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 't': cp = '\t'; break;
      case 'u': {
        std::uint32_t unit = 0;
        if (!hex4(i + 2, unit)) return false;
        if (unit >= 0xDC00 && unit <= 0xDFFF) return fail(i, "lone surrogate in string");
        if (unit >= 0xD800 && unit <= 0xDBFF) {
          std::uint32_t low = 0;
          if (i + 7 >= n_ || in_[i + 6] != '\\' || in_[i + 7] != 'u' || !hex4(i + 8, low) ||
              low < 0xDC00 || low > 0xDFFF) {
            return fail(i, "lone surrogate in string");
          }
          cp = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
          i += 12;
          return true;
        }
        cp = unit;
        i += 6;
        return true;
      }
      default: return fail(i, "invalid escape in string");
    }
    i += 2;
    return true;
  }

  bool hex4(std::size_t at, std::uint32_t& unit) {
    if (at + 4 > n_) return fail(at, "invalid \\u escape in string");
    unit = 0;
    for (std::size_t j = at; j < at + 4; ++j) {
      const int h = hex_value(in_[j]);
      if (h < 0) return fail(at, "invalid \\u escape in string");
      unit = unit * 16 + static_cast<std::uint32_t>(h);
    }
    return true;
  }

  IDEM_HOT Node number() {
    const std::size_t begin = pos_;
    std::size_t i = pos_;
    const bool negative = in_[i] == '-';
    if (negative) ++i;
    const std::size_t int_begin = i;
    if (i < n_ && in_[i] == '0') {
      ++i;
      if (i < n_ && is_digit(in_[i])) return failed(int_begin, "leading zero in number");
    } else if (i < n_ && is_digit(in_[i])) {
      while (i < n_ && is_digit(in_[i])) ++i;
    } else {
      return failed(begin, "invalid number");
    }
    const std::size_t int_end = i;
    std::size_t frac_begin = i, frac_end = i;
    if (i < n_ && in_[i] == '.') {
      frac_begin = ++i;
      while (i < n_ && is_digit(in_[i])) ++i;
      frac_end = i;
      if (frac_end == frac_begin) return failed(begin, "invalid number");
    }
    bool has_exponent = false;
    if (i < n_ && (in_[i] == 'e' || in_[i] == 'E')) {
      has_exponent = true;
      ++i;
      if (i < n_ && (in_[i] == '+' || in_[i] == '-')) ++i;
      const std::size_t exp_begin = i;
      while (i < n_ && is_digit(in_[i])) ++i;
      if (i == exp_begin) return failed(begin, "invalid number");
    }
    pos_ = i;
    Node node;
    if (!has_exponent && fast_number(begin, int_begin, int_end, frac_begin, frac_end, node)) {
      return node;
    }
    return slow_number(begin, int_begin, int_end, frac_begin, frac_end);
  }

  // Numbers the fast path does not take: the full conversion to double and back.
  [[gnu::noinline]] Node slow_number(std::size_t begin, std::size_t int_begin,
                                     std::size_t int_end, std::size_t frac_begin,
                                     std::size_t frac_end) {
    const std::size_t i = pos_;
    double value = 0;
    const auto r = std::from_chars(in_ + begin, in_ + i, value);
    if (r.ec == std::errc::result_out_of_range) {
      // from_chars reports underflow like overflow; ECMAScript reads a tiny number as 0.
      if (!is_tiny(int_begin, int_end, frac_begin, frac_end, i)) {
        return failed(begin, "number out of range");
      }
      value = 0;
    } else if (r.ec != std::errc() || r.ptr != in_ + i || !std::isfinite(value)) {
      return failed(begin, "invalid number");
    }
    char buf[32];
    const std::size_t len = format_number(value, buf);
    const std::size_t out_begin = side_.size();
    side_.append(buf, len);
    return make_node(Text::make(Kind::side, out_begin, len), len);
  }

  // Numbers without exponent whose significant digits number at most 15 and whose decimal
  // point sits where ECMAScript prints them in fixed notation. Every decimal of at most 15
  // significant digits round-trips through a double, so the shortest form of its double has
  // exactly those digits: the canonical form is the input without trailing fraction zeros,
  // which is a prefix of the input (or "0" for zero).
  IDEM_HOT bool fast_number(std::size_t begin, std::size_t int_begin, std::size_t int_end,
                   std::size_t frac_begin, std::size_t frac_end, Node& node) {
    const std::size_t int_len = int_end - int_begin;
    if (int_len > 21) return false;
    std::size_t trimmed = frac_end;
    while (trimmed > frac_begin && in_[trimmed - 1] == '0') --trimmed;
    std::size_t significant = 0;
    if (in_[int_begin] != '0') {
      if (trimmed > frac_begin) {
        significant = int_len + (trimmed - frac_begin);
      } else {
        std::size_t last = int_end;
        while (in_[last - 1] == '0') --last;
        significant = last - int_begin;
      }
    } else {
      std::size_t first = frac_begin;
      while (first < trimmed && in_[first] == '0') ++first;
      if (first == trimmed) {  // zero, maybe "-0.0"; the '0' at int_begin is its canonical form
        node = make_node(Text::make(Kind::input, int_begin, 1), 1);
        return true;
      }
      if (first - frac_begin >= 6) return false;  // 1e-7 and smaller print in exponent form
      significant = trimmed - first;
    }
    if (significant > 15) return false;
    const std::size_t end = trimmed > frac_begin ? trimmed : int_end;
    node = make_node(Text::make(Kind::input, begin, end - begin), end - begin);
    return true;
  }

  // Whether an out-of-range number is below the smallest double rather than above the largest:
  // its decimal magnitude is negative.
  bool is_tiny(std::size_t int_begin, std::size_t int_end, std::size_t frac_begin,
               std::size_t frac_end, std::size_t end) const {
    std::int64_t exponent = 0;
    std::size_t i = frac_end;
    if (i < end) {  // 'e', sign, digits
      ++i;
      const bool negative = in_[i] == '-';
      if (in_[i] == '+' || in_[i] == '-') ++i;
      for (; i < end; ++i) {
        exponent = std::min<std::int64_t>(exponent * 10 + (in_[i] - '0'), 1'000'000'000);
      }
      if (negative) exponent = -exponent;
    }
    std::size_t first = int_begin;
    while (first < int_end && in_[first] == '0') ++first;
    if (first < int_end) return exponent + static_cast<std::int64_t>(int_end - first) - 1 < 0;
    std::size_t zeros = 0;
    while (frac_begin + zeros < frac_end && in_[frac_begin + zeros] == '0') ++zeros;
    return exponent - static_cast<std::int64_t>(zeros) - 1 < 0;
  }

  IDEM_HOT void write_text(Text t, char*& p) const {
    const Kind kind = t.kind();
    // side_ and keys_ end with 16 spare bytes; the input may not.
    copy_text(p, base(kind) + t.off(), t.len(), kind != Kind::input || t.off() + 16 <= n_);
  }

  // Containers recurse; scalars are copied in place, being most of the nodes.
  void write(const Node& node, char*& p) const {
    switch (node.text.kind()) {
      case Kind::array: {
        *p++ = '[';
        const Node* child = elements_.data() + node.text.off();
        for (std::uint32_t j = 0; j < node.text.len(); ++j) {
          if (j > 0) *p++ = ',';
          write_value(child[j], p);
        }
        *p++ = ']';
        return;
      }
      case Kind::object: {
        *p++ = '{';
        const Entry* entry = members_.data() + node.text.off();
        for (std::uint32_t j = 0; j < node.text.len(); ++j) {
          if (j > 0) *p++ = ',';
          write_text(entry[j].name_out, p);
          *p++ = ':';
          write_value(entry[j].value, p);
        }
        *p++ = '}';
        return;
      }
      default: write_text(node.text, p);
    }
  }

  IDEM_HOT void write_value(const Node& node, char*& p) const {
    const Kind kind = node.text.kind();
    if (kind == Kind::array || kind == Kind::object) {
      write(node, p);
    } else {
      write_text(node.text, p);
    }
  }

  const char* in_;
  std::size_t n_;
  std::size_t pos_ = 0;
  Scratch& scratch_;
  std::string& side_ = scratch_.side;
  std::string& keys_ = scratch_.keys;
  PodStack<Member>& member_stack_ = scratch_.member_stack;
  PodStack<Entry>& members_ = scratch_.members;
  PodStack<Node>& element_stack_ = scratch_.element_stack;
  PodStack<Node>& elements_ = scratch_.elements;
  std::vector<std::vector<PointerToken>>& pointers_ = scratch_.pointers;
  std::vector<std::uint32_t>& active_ = scratch_.active;
  JsonError error_;
};

#undef IDEM_HOT

}  // namespace

std::expected<std::string, JsonError> canonicalize_json(std::string_view json,
                                                        std::span<const std::string> exclude) {
  thread_local Scratch scratch;
  return Parser(json, exclude, scratch).run();
}

std::string format_json_number(double value) {
  // Outside the contract, but as ECMAScript prints them rather than undefined behaviour.
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  char buf[32];
  return std::string(buf, format_number(value, buf));
}

}  // namespace idem
