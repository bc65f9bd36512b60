#include "idem/jcs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace idem {
namespace {

std::string canon(std::string_view json, std::vector<std::string> exclude = {}) {
  auto result = canonicalize_json(json, exclude);
  EXPECT_TRUE(result.has_value()) << json << " -> " << result.error().message << " at "
                                  << result.error().offset;
  return result.value_or("<error>");
}

JsonError error_of(std::string_view json) {
  auto result = canonicalize_json(json);
  EXPECT_FALSE(result.has_value()) << json << " -> " << *result;
  return result.has_value() ? JsonError{} : result.error();
}

// ---------------------------------------------------------------------------------------------
// RFC 8785 published examples

TEST(FormatJsonNumber, Rfc8785AppendixB) {
  const std::pair<std::uint64_t, const char*> table[] = {
      {0x0000000000000000, "0"},
      {0x8000000000000000, "0"},
      {0x0000000000000001, "5e-324"},
      {0x8000000000000001, "-5e-324"},
      {0x7fefffffffffffff, "1.7976931348623157e+308"},
      {0xffefffffffffffff, "-1.7976931348623157e+308"},
      {0x4340000000000000, "9007199254740992"},
      {0xc340000000000000, "-9007199254740992"},
      {0x4430000000000000, "295147905179352830000"},
      {0x44b52d02c7e14af5, "9.999999999999997e+22"},
      {0x44b52d02c7e14af6, "1e+23"},
      {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
      {0x444b1ae4d6e2ef4e, "999999999999999700000"},
      {0x444b1ae4d6e2ef4f, "999999999999999900000"},
      {0x444b1ae4d6e2ef50, "1e+21"},
      {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
      {0x3eb0c6f7a0b5ed8d, "0.000001"},
      {0x41b3de4355555553, "333333333.3333332"},
      {0x41b3de4355555554, "333333333.33333325"},
      {0x41b3de4355555555, "333333333.3333333"},
      {0x41b3de4355555556, "333333333.3333334"},
      {0x41b3de4355555557, "333333333.33333343"},
      {0xbecbf647612f3696, "-0.0000033333333333333333"},
      {0x43143ff3c1cb0959, "1424953923781206.2"},
  };
  for (const auto& [bits, expected] : table) {
    const double value = std::bit_cast<double>(bits);
    EXPECT_EQ(format_json_number(value), expected) << std::hex << bits;
    // The same number written in JSON, in its canonical and in a long form, canonicalises alike.
    EXPECT_EQ(canon(expected), expected);
    char long_form[64];
    const auto r = std::to_chars(long_form, long_form + sizeof long_form, value,
                                 std::chars_format::scientific, 25);
    EXPECT_EQ(canon(std::string_view(long_form, r.ptr)), expected) << long_form;
  }
}

TEST(FormatJsonNumber, EcmaScriptLayout) {
  EXPECT_EQ(format_json_number(1e21), "1e+21");
  EXPECT_EQ(format_json_number(1e20), "100000000000000000000");
  EXPECT_EQ(format_json_number(123456789012345680000.0), "123456789012345680000");
  EXPECT_EQ(format_json_number(1e-7), "1e-7");
  EXPECT_EQ(format_json_number(0.000001), "0.000001");
  EXPECT_EQ(format_json_number(-0.0), "0");
  EXPECT_EQ(format_json_number(1.5), "1.5");
  EXPECT_EQ(format_json_number(-1.5e-9), "-1.5e-9");
  EXPECT_EQ(format_json_number(1.25e25), "1.25e+25");
  EXPECT_EQ(format_json_number(100), "100");
}

TEST(FormatJsonNumber, NonFiniteAsEcmaScriptPrintsThem) {
  EXPECT_EQ(format_json_number(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(format_json_number(std::numeric_limits<double>::infinity()), "Infinity");
  EXPECT_EQ(format_json_number(-std::numeric_limits<double>::infinity()), "-Infinity");
}

TEST(CanonicalizeJson, Rfc8785SampleObject) {
  const std::string input = R"({
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
})";
  EXPECT_EQ(canon(input),
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
            "\"string\":\"\xE2\x82\xAC$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}");
}

TEST(CanonicalizeJson, Rfc8785SortingExample) {
  const std::string input = R"({
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
})";
  EXPECT_EQ(canon(input),
            "{\"\\r\":\"Carriage Return\","
            "\"1\":\"One\","
            "\"\xC2\x80\":\"Control\","
            "\"\xC3\xB6\":\"Latin Small Letter O With Diaeresis\","
            "\"\xE2\x82\xAC\":\"Euro Sign\","
            "\"\xF0\x9F\x98\x80\":\"Emoji: Grinning Face\","
            "\"\xEF\xAC\xB3\":\"Hebrew Letter Dalet With Dagesh\"}");
}

// ---------------------------------------------------------------------------------------------
// Accepted input

TEST(CanonicalizeJson, Scalars) {
  EXPECT_EQ(canon("true"), "true");
  EXPECT_EQ(canon(" null "), "null");
  EXPECT_EQ(canon("\t\r\n false"), "false");
  EXPECT_EQ(canon("\"\""), "\"\"");
  EXPECT_EQ(canon("0"), "0");
  EXPECT_EQ(canon("-0"), "0");
  EXPECT_EQ(canon("-0.000"), "0");
  EXPECT_EQ(canon("0e10"), "0");
  EXPECT_EQ(canon("-0E-3"), "0");
  EXPECT_EQ(canon("12.50"), "12.5");
  EXPECT_EQ(canon("100.000"), "100");
  EXPECT_EQ(canon("1e2"), "100");
  EXPECT_EQ(canon("1E+2"), "100");
  EXPECT_EQ(canon("0.0000010"), "0.000001");
  EXPECT_EQ(canon("0.0000001"), "1e-7");
  EXPECT_EQ(canon("100000000000000000000"), "100000000000000000000");
  EXPECT_EQ(canon("1000000000000000000000"), "1e+21");
  EXPECT_EQ(canon("123456789012345678"), "123456789012345680");
  EXPECT_EQ(canon("0.1234567890123456789"), "0.12345678901234568");
  EXPECT_EQ(canon("9007199254740993"), "9007199254740992");
  EXPECT_EQ(canon("1e-400"), "0");  // as JSON.parse reads it
  EXPECT_EQ(canon("-1e-400"), "0");
  EXPECT_EQ(canon("0.0000000000000000000000000000000000000000000000000000000000000000000000000000"
                  "000000000000000000000000000000000000000000000000000000000000000000000000000000"
                  "000000000000000000000000000000000000000000000000000000000000000000000000000000"
                  "000000000000000000000000000000000000000000000000000000000000000000000000000000"
                  "00000000000000000000000000000000000000000000000000000000001"),
            "0");
}

TEST(CanonicalizeJson, StringsAreMinimallyEscaped) {
  EXPECT_EQ(canon(R"("\u0000\u0001\u001F\u0020")"), R"("\u0000\u0001\u001f ")");
  EXPECT_EQ(canon(R"("\b\f\n\r\t")"), R"("\b\f\n\r\t")");
  EXPECT_EQ(canon(R"("\u0008\u000C\u000A\u000D\u0009")"), R"("\b\f\n\r\t")");
  EXPECT_EQ(canon(R"("\/\u002F/")"), R"("///")");
  EXPECT_EQ(canon(R"("\u007f\u0080")"), "\"\x7F\xC2\x80\"");
  EXPECT_EQ(canon("\"\x7F\""), "\"\x7F\"");
  EXPECT_EQ(canon(R"("\uD834\uDD1E")"), "\"\xF0\x9D\x84\x9E\"");
  EXPECT_EQ(canon("\"\xF0\x9D\x84\x9E \xE2\x82\xAC \xC3\xB6\""),
            "\"\xF0\x9D\x84\x9E \xE2\x82\xAC \xC3\xB6\"");
  EXPECT_EQ(canon(R"("\u00e9t\u00E9")"), "\"\xC3\xA9t\xC3\xA9\"");
  EXPECT_EQ(canon(R"("a\"b\\c")"), R"("a\"b\\c")");
  EXPECT_EQ(canon(R"("a long string that goes past eight bytes\u0041 then more text")"),
            R"("a long string that goes past eight bytesA then more text")");
}

TEST(CanonicalizeJson, ContainersAndWhitespace) {
  EXPECT_EQ(canon(" { } "), "{}");
  EXPECT_EQ(canon("[ ]"), "[]");
  EXPECT_EQ(canon("[ [ ] , { } , [ { } ] ]"), "[[],{},[{}]]");
  EXPECT_EQ(canon(R"({ "b" : [ 1 , 2 ] , "a" : { "d" : 1 , "c" : 2 } })"),
            R"({"a":{"c":2,"d":1},"b":[1,2]})");
}

TEST(CanonicalizeJson, KeysSortedByUtf16CodeUnits) {
  // U+FFFD sorts after U+1F600 in UTF-16 (0xD83D) though before it in UTF-8 and code points.
  EXPECT_EQ(canon(R"({"\ufffd":1,"\ud83d\ude00":2,"\ue000":3,"\ud7ff":4})"),
            "{\"\xED\x9F\xBF\":4,\"\xF0\x9F\x98\x80\":2,\"\xEE\x80\x80\":3,\"\xEF\xBF\xBD\":1}");
  EXPECT_EQ(canon(R"({"ab":1,"a":2,"":3,"b":4,"aa":5})"), R"({"":3,"a":2,"aa":5,"ab":1,"b":4})");
  // Escaped and raw spellings of one name are the same name.
  EXPECT_EQ(canon(R"({"\u0062":1,"a":2})"), R"({"a":2,"b":1})");
  EXPECT_EQ(canon(R"({"a\nb":1,"a":2,"a b":3})"), R"({"a":2,"a\nb":1,"a b":3})");
}

TEST(CanonicalizeJson, DeepNestingUpToTheLimit) {
  const std::string ok = std::string(512, '[') + std::string(512, ']');
  EXPECT_EQ(canon(ok), ok);
  std::string objects;
  for (int i = 0; i < 512; ++i) objects += "{\"a\":";
  objects += "1" + std::string(512, '}');
  EXPECT_EQ(canon(objects), objects);
}

TEST(CanonicalizeJson, LargeInput) {
  std::string big = "[";
  for (int i = 0; i < 100000; ++i) {
    if (i > 0) big += ", ";
    big += R"({"z": )" + std::to_string(i) + R"(.50, "a": "item)" + std::to_string(i) + "\"}";
  }
  big += "]";
  const std::string out = canon(big);
  EXPECT_EQ(out.substr(0, 48), R"([{"a":"item0","z":0.5},{"a":"item1","z":1.5},{"a)");
  EXPECT_EQ(canon(out), out);
}

// ---------------------------------------------------------------------------------------------
// Rejected input

TEST(CanonicalizeJson, RejectsDuplicateKeys) {
  const JsonError e = error_of(R"({"a":1,"a":2})");
  EXPECT_EQ(e.message, "duplicate object key \"a\"");
  EXPECT_EQ(e.offset, 7u);
  // Spelled differently, still the same name; reported where the reader meets the second.
  const JsonError f = error_of(R"({"b":0,"\u0061":1,"c":2,"a":3,"b":4})");
  EXPECT_EQ(f.message, "duplicate object key \"a\"");
  EXPECT_EQ(f.offset, 24u);
  EXPECT_EQ(error_of("{\"x\":{\"\\n\":1,\"\\u000a\":2}}").message,
            "duplicate object key \"\\n\"");
  // Even when the member is excluded by a pointer.
  EXPECT_FALSE(canonicalize_json(R"({"a":1,"a":2})", std::vector<std::string>{"/a"}));
}

TEST(CanonicalizeJson, RejectsMalformedJson) {
  EXPECT_EQ(error_of("").message, "unexpected end of input");
  EXPECT_EQ(error_of("   ").offset, 3u);
  EXPECT_EQ(error_of("{} x").message, "unexpected data after the JSON value");
  EXPECT_EQ(error_of("{} x").offset, 3u);
  EXPECT_EQ(error_of("1 2").offset, 2u);
  EXPECT_EQ(error_of("[1,]").message, "unexpected ']'");
  EXPECT_EQ(error_of("{\"a\":1,}").message, "expected a string as object key");
  EXPECT_EQ(error_of("{\"a\" 1}").message, "expected ':' after object key");
  EXPECT_EQ(error_of("[1 2]").message, "expected ',' or ']' in array");
  EXPECT_EQ(error_of("{\"a\":1 \"b\":2}").message, "expected ',' or '}' in object");
  EXPECT_EQ(error_of("[1").message, "unexpected end of input");
  EXPECT_EQ(error_of("{\"a\":").message, "unexpected end of input");
  EXPECT_EQ(error_of("\"abc").message, "unterminated string");
  EXPECT_EQ(error_of("tru").message, "unexpected 't'");
  EXPECT_EQ(error_of("nul").message, "unexpected 'n'");
  EXPECT_EQ(error_of("True").message, "unexpected 'T'");
  EXPECT_EQ(error_of("{'a':1}").message, "expected a string as object key");
  EXPECT_EQ(error_of("\xEF\xBB\xBF{}").message, "unexpected byte 0xEF");  // BOM
  EXPECT_EQ(error_of("// c\n{}").message, "unexpected '/'");
  error_of("[1]]");
  error_of("{}}");
}

TEST(CanonicalizeJson, RejectsBadNumbers) {
  EXPECT_EQ(error_of("01").message, "leading zero in number");
  EXPECT_EQ(error_of("-01").message, "leading zero in number");
  EXPECT_EQ(error_of("[00]").offset, 1u);
  EXPECT_EQ(error_of("1.").message, "invalid number");
  EXPECT_EQ(error_of("-").message, "invalid number");
  EXPECT_EQ(error_of("1e").message, "invalid number");
  EXPECT_EQ(error_of("1e+").message, "invalid number");
  EXPECT_EQ(error_of(".5").message, "unexpected '.'");
  EXPECT_EQ(error_of("+1").message, "unexpected '+'");
  EXPECT_EQ(error_of("0x10").message, "unexpected data after the JSON value");
  EXPECT_EQ(error_of("1e400").message, "number out of range");
  EXPECT_EQ(error_of("[-1e400]").offset, 1u);
  EXPECT_EQ(error_of("1" + std::string(400, '0')).message, "number out of range");
  EXPECT_EQ(error_of("NaN").message, "unexpected 'N'");
  EXPECT_EQ(error_of("Infinity").message, "unexpected 'I'");
  EXPECT_EQ(error_of("-Infinity").message, "invalid number");
}

TEST(CanonicalizeJson, RejectsBadStrings) {
  EXPECT_EQ(error_of(R"("\ud800")").message, "lone surrogate in string");
  EXPECT_EQ(error_of(R"("\udc00\ud800")").message, "lone surrogate in string");
  EXPECT_EQ(error_of(R"("a\ud83dx")").offset, 2u);
  EXPECT_EQ(error_of(R"("\ud83d\u0041")").message, "lone surrogate in string");
  EXPECT_EQ(error_of(R"({"\udfff":1})").message, "lone surrogate in string");
  EXPECT_EQ(error_of(R"("\x")").message, "invalid escape in string");
  EXPECT_EQ(error_of(R"("\u12")").message, "invalid \\u escape in string");
  EXPECT_EQ(error_of(R"("\u12G4")").message, "invalid \\u escape in string");
  EXPECT_EQ(error_of("\"a\tb\"").message, "control character in string");
  EXPECT_EQ(error_of("\"a\nb\"").offset, 2u);
  EXPECT_EQ(error_of(std::string("\"a\0b\"", 5)).message, "control character in string");
  const char* invalid_utf8[] = {
      "\"\x80\"",              // lone continuation byte
      "\"\xC0\xAF\"",          // overlong '/'
      "\"\xC1\xBF\"",          // overlong
      "\"\xE0\x80\xAF\"",      // overlong
      "\"\xED\xA0\x80\"",      // UTF-8 encoded surrogate U+D800
      "\"\xF0\x80\x80\xAF\"",  // overlong
      "\"\xF4\x90\x80\x80\"",  // above U+10FFFF
      "\"\xF5\x80\x80\x80\"",
      "\"\xFF\"",
      "\"\xC3\"",              // truncated
      "\"\xE2\x82\"",          // truncated
      "\"abcdefghij\xC3(\"",   // bad continuation after a fast-scanned run
  };
  for (const char* s : invalid_utf8) {
    EXPECT_EQ(error_of(s).message, "invalid UTF-8 in string") << s;
  }
  EXPECT_EQ(error_of("\"abcdefghij\xC3(\"").offset, 11u);
  EXPECT_EQ(error_of("{\"\xC3\":1}").message, "invalid UTF-8 in string");
  EXPECT_EQ(error_of("\"\\n\xC3(\"").message, "invalid UTF-8 in string");  // after an escape
}

TEST(CanonicalizeJson, RejectsDepthBomb) {
  const JsonError arrays = error_of(std::string(513, '[') + std::string(513, ']'));
  EXPECT_EQ(arrays.message, "nesting deeper than 512 levels");
  EXPECT_EQ(arrays.offset, 512u);
  // Far deeper than any stack would survive with naive recursion.
  EXPECT_EQ(error_of(std::string(1 << 20, '[')).message, "nesting deeper than 512 levels");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  EXPECT_EQ(error_of(objects).message, "nesting deeper than 512 levels");
}

// ---------------------------------------------------------------------------------------------
// JSON Pointer exclusion (RFC 6901)

TEST(CanonicalizeJson, ExcludesPointedMembers) {
  const std::string doc =
      R"({"client_ts":"2024-01-01","amount":10,"meta":{"trace":"x","keep":1},)"
      R"("items":[{"id":1,"ts":5},{"id":2,"ts":6}],"a/b":1,"m~n":2,"":3})";
  EXPECT_EQ(canon(doc, {"/client_ts"}),
            R"({"":3,"a/b":1,"amount":10,"items":[{"id":1,"ts":5},{"id":2,"ts":6}],)"
            R"("meta":{"keep":1,"trace":"x"},"m~n":2})");
  EXPECT_EQ(canon(doc, {"/meta/trace", "/items/1/ts", "/a~1b", "/m~0n", "/"}),
            R"({"amount":10,"client_ts":"2024-01-01","items":[{"id":1,"ts":5},{"id":2}],)"
            R"("meta":{"keep":1}})");
  EXPECT_EQ(canon(doc, {"/items/0"}),
            R"({"":3,"a/b":1,"amount":10,"client_ts":"2024-01-01","items":[{"id":2,"ts":6}],)"
            R"("meta":{"keep":1,"trace":"x"},"m~n":2})");
  EXPECT_EQ(canon(doc, {"/items", "/meta", "/amount", "/client_ts", "/a~1b", "/m~0n", "/"}), "{}");
}

TEST(CanonicalizeJson, ExclusionUsesOriginalArrayIndices) {
  EXPECT_EQ(canon("[0,1,2,3]", {"/1", "/2"}), "[0,3]");
  EXPECT_EQ(canon("[[0,1],[2,3]]", {"/1/0", "/0/1"}), "[[0],[3]]");
  EXPECT_EQ(canon("[0,1,2]", {"/0", "/1", "/2"}), "[]");
}

TEST(CanonicalizeJson, PointersThatMatchNothingAreIgnored) {
  const std::string doc = R"({"a":[1,{"b":2}],"0":3})";
  const std::string full = R"({"0":3,"a":[1,{"b":2}]})";
  for (const char* pointer : {"", "a", "/x", "/a/2", "/a/-", "/a/01", "/a/b", "/a/1/b/c",
                              "/a/0/x", "/~2", "/a~", "/0/0", "/a/18446744073709551617"}) {
    EXPECT_EQ(canon(doc, {pointer}), full) << pointer;
  }
  // An index token on an object names the member spelled that way.
  EXPECT_EQ(canon(doc, {"/0"}), R"({"a":[1,{"b":2}]})");
  EXPECT_EQ(canon(doc, {"/a/1/b"}), R"({"0":3,"a":[1,{}]})");
}

TEST(CanonicalizeJson, ExcludedValuesAreStillValidated) {
  EXPECT_FALSE(canonicalize_json(R"({"a":[01],"b":1})", std::vector<std::string>{"/a"}));
  EXPECT_FALSE(canonicalize_json(R"({"a":"\ud800"})", std::vector<std::string>{"/a"}));
}

// ---------------------------------------------------------------------------------------------
// Property tests: random documents, random spellings

// A JSON value for the generator, with an independent (slow, obvious) canonical writer.
struct Value {
  enum Type { null_, boolean, number, string, array, object } type = null_;
  bool b = false;
  double n = 0;
  std::u32string s;
  std::vector<Value> items;
  std::vector<std::pair<std::u32string, Value>> members;
};

void put_utf8(std::string& out, char32_t cp) {
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

std::u16string to_utf16(const std::u32string& s) {
  std::u16string out;
  for (char32_t cp : s) {
    if (cp < 0x10000) {
      out += static_cast<char16_t>(cp);
    } else {
      out += static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10));
      out += static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF));
    }
  }
  return out;
}

void reference_string(std::string& out, const std::u32string& s) {
  out += '"';
  for (char32_t cp : s) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (cp < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
          out += buf;
        } else {
          put_utf8(out, cp);
        }
    }
  }
  out += '"';
}

void reference_canonical(std::string& out, const Value& v) {
  switch (v.type) {
    case Value::null_: out += "null"; break;
    case Value::boolean: out += v.b ? "true" : "false"; break;
    case Value::number: out += format_json_number(v.n); break;
    case Value::string: reference_string(out, v.s); break;
    case Value::array:
      out += '[';
      for (std::size_t i = 0; i < v.items.size(); ++i) {
        if (i > 0) out += ',';
        reference_canonical(out, v.items[i]);
      }
      out += ']';
      break;
    case Value::object: {
      std::vector<const std::pair<std::u32string, Value>*> sorted;
      for (const auto& m : v.members) sorted.push_back(&m);
      std::sort(sorted.begin(), sorted.end(),
                [](auto* a, auto* b) { return to_utf16(a->first) < to_utf16(b->first); });
      out += '{';
      for (std::size_t i = 0; i < sorted.size(); ++i) {
        if (i > 0) out += ',';
        reference_string(out, sorted[i]->first);
        out += ':';
        reference_canonical(out, sorted[i]->second);
      }
      out += '}';
      break;
    }
  }
}

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  Value value(int depth) {
    const int pick = uniform(0, depth > 4 ? 3 : 5);
    Value v;
    switch (pick) {
      case 0: v.type = uniform(0, 1) ? Value::null_ : Value::boolean; v.b = uniform(0, 1); break;
      case 1: v.type = Value::number; v.n = number(); break;
      case 2:
      case 3: v.type = Value::string; v.s = text(); break;
      case 4:
        v.type = Value::array;
        for (int i = uniform(0, 5); i > 0; --i) v.items.push_back(value(depth + 1));
        break;
      default: {
        v.type = Value::object;
        std::vector<std::u16string> seen;
        for (int i = uniform(0, 6); i > 0; --i) {
          std::u32string name = text();
          const std::u16string key = to_utf16(name);
          if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
          seen.push_back(key);
          v.members.emplace_back(std::move(name), value(depth + 1));
        }
      }
    }
    return v;
  }

  // Writes `v` as some valid JSON text: random member order, whitespace, escapes and number
  // spellings.
  void spell(std::string& out, const Value& v) {
    ws(out);
    switch (v.type) {
      case Value::null_: out += "null"; break;
      case Value::boolean: out += v.b ? "true" : "false"; break;
      case Value::number: spell_number(out, v.n); break;
      case Value::string: spell_string(out, v.s); break;
      case Value::array:
        out += '[';
        for (std::size_t i = 0; i < v.items.size(); ++i) {
          if (i > 0) out += ',';
          spell(out, v.items[i]);
        }
        if (v.items.empty()) ws(out);
        out += ']';
        break;
      case Value::object: {
        std::vector<std::size_t> order(v.members.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng_);
        out += '{';
        for (std::size_t i = 0; i < order.size(); ++i) {
          if (i > 0) out += ',';
          ws(out);
          spell_string(out, v.members[order[i]].first);
          ws(out);
          out += ':';
          spell(out, v.members[order[i]].second);
        }
        if (order.empty()) ws(out);
        out += '}';
        break;
      }
    }
    ws(out);
  }

  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

 private:
  double number() {
    switch (uniform(0, 6)) {
      case 0: return uniform(-1000, 1000);
      case 1: return uniform(-100000, 100000) / 100.0;
      case 2: return std::ldexp(uniform(1, 1 << 30), uniform(-60, 60));
      case 3: return std::pow(10.0, uniform(-30, 30)) * (uniform(0, 1) ? 1 : -1);
      default: {
        double d;
        do {
          d = std::bit_cast<double>(std::uniform_int_distribution<std::uint64_t>()(rng_));
        } while (!std::isfinite(d));
        return d;
      }
    }
  }

  std::u32string text() {
    static const char32_t pool[] = {
        U'a', U'b', U'z', U'A', U'0', U'9', U' ', U'"', U'\\', U'/', U'\n', U'\t', U'\x01',
        U'\x1f', U'\x7f', U'\x80', U'\xf6', U'\u20ac', U'\ud7ff', U'\ue000', U'\ufb33',
        U'\uffff', U'\U00010000', U'\U0001f600', U'\U0010ffff', U'~'};
    std::u32string s;
    for (int i = uniform(0, 12); i > 0; --i) {
      s += pool[uniform(0, static_cast<int>(std::size(pool)) - 1)];
    }
    return s;
  }

  void ws(std::string& out) {
    static const char spaces[] = " \t\n\r";
    if (uniform(0, 2) != 0) return;
    for (int i = uniform(1, 3); i > 0; --i) out += spaces[uniform(0, 3)];
  }

  void spell_string(std::string& out, const std::u32string& s) {
    out += '"';
    for (char32_t cp : s) {
      const bool must = cp < 0x20 || cp == '"' || cp == '\\';
      if (!must && uniform(0, 3) != 0) {
        put_utf8(out, cp);
        continue;
      }
      if (cp < 0x80 && uniform(0, 1)) {
        const char* short_form = nullptr;
        switch (cp) {
          case '"': short_form = "\\\""; break;
          case '\\': short_form = "\\\\"; break;
          case '/': short_form = "\\/"; break;
          case '\b': short_form = "\\b"; break;
          case '\f': short_form = "\\f"; break;
          case '\n': short_form = "\\n"; break;
          case '\r': short_form = "\\r"; break;
          case '\t': short_form = "\\t"; break;
        }
        if (short_form != nullptr) {
          out += short_form;
          continue;
        }
      }
      const std::u32string one(1, cp);
      for (char16_t unit : to_utf16(one)) {
        char buf[8];
        std::snprintf(buf, sizeof buf, uniform(0, 1) ? "\\u%04x" : "\\u%04X",
                      static_cast<unsigned>(unit));
        out += buf;
      }
    }
    out += '"';
  }

  void spell_number(std::string& out, double d) {
    char buf[64];
    std::to_chars_result r{};
    switch (uniform(0, 4)) {
      case 0: r = std::to_chars(buf, buf + sizeof buf, d); break;
      case 1: r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific); break;
      case 2: r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::general, 17); break;
      case 3:
        r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific, 20);
        break;
      default: {
        // Plain decimals with trailing zeros, where the value allows it.
        if (std::abs(d) < 1e15 && std::abs(d) > 1e-5) {
          r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
          std::string s(buf, r.ptr);
          if (s.find('.') == std::string::npos) s += '.';
          s += std::string(static_cast<std::size_t>(uniform(1, 3)), '0');
          out += s;
          return;
        }
        r = std::to_chars(buf, buf + sizeof buf, d);
      }
    }
    std::string s(buf, r.ptr);
    if (uniform(0, 1)) std::replace(s.begin(), s.end(), 'e', 'E');
    out += s;
  }

  std::mt19937_64 rng_;
};

TEST(CanonicalizeJsonProperty, MatchesReferenceAndIgnoresSpelling) {
  Generator gen(20240611);
  for (int round = 0; round < 2000; ++round) {
    const Value v = gen.value(0);
    std::string expected;
    reference_canonical(expected, v);
    std::string a, b;
    gen.spell(a, v);
    gen.spell(b, v);
    const std::string ca = canon(a);
    ASSERT_EQ(ca, expected) << "input: " << a;
    ASSERT_EQ(canon(b), ca) << "inputs:\n" << a << "\n" << b;
    ASSERT_EQ(canon(ca), ca) << "not a fixed point: " << ca;
  }
}

TEST(CanonicalizeJsonProperty, MutatedInputIsRejectedOrCanonicalisedConsistently) {
  // Hostile-input smoke test (most useful under -fsanitize=address,undefined): corrupt valid
  // documents byte by byte; whatever is still accepted must canonicalise to a fixed point.
  Generator gen(4242);
  std::mt19937_64 rng(4242);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  static const char interesting[] = "{}[]\",:\\u0123456789eE+-.tfn \x7f\x80\xc3\xed\xf0\xff";
  int accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string text;
    gen.spell(text, gen.value(0));
    for (int edits = 1 + static_cast<int>(pick(3)); edits > 0 && !text.empty(); --edits) {
      const std::size_t at = pick(text.size());
      const char c = interesting[pick(sizeof interesting - 1)];
      switch (pick(4)) {
        case 0: text[at] = c; break;
        case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        case 2: text.erase(at, 1); break;
        default: text.resize(at); break;
      }
    }
    const auto result = canonicalize_json(text, std::vector<std::string>{"/a", "/0/b"});
    if (!result) {
      ASSERT_LE(result.error().offset, text.size()) << text;
      ASSERT_FALSE(result.error().message.empty());
      ASSERT_EQ(result.error().message.find('\n'), std::string::npos);
      continue;
    }
    ++accepted;
    ASSERT_EQ(canon(*result), *result) << "input: " << text;
  }
  EXPECT_GT(accepted, 0);
}

TEST(CanonicalizeJsonProperty, DecimalFastPathAgreesWithFullConversion) {
  std::mt19937_64 rng(7);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 50000; ++round) {
    std::string s;
    if (uniform(0, 1)) s += '-';
    const int int_digits = uniform(0, 22);
    if (int_digits == 0) {
      s += '0';
    } else {
      s += static_cast<char>('1' + uniform(0, 8));
      for (int i = 1; i < int_digits; ++i) s += static_cast<char>('0' + (uniform(0, 2) ? uniform(0, 9) : 0));
    }
    if (uniform(0, 2)) {
      s += '.';
      const int zeros = uniform(0, 8);
      s += std::string(static_cast<std::size_t>(zeros), '0');
      for (int i = uniform(1, 18); i > 0; --i) s += static_cast<char>('0' + (uniform(0, 2) ? uniform(0, 9) : 0));
    }
    double d = 0;
    std::from_chars(s.data(), s.data() + s.size(), d);
    ASSERT_EQ(canon(s), format_json_number(d)) << s;
  }
}

TEST(FormatJsonNumberProperty, RoundTripsAndIsCanonical) {
  std::mt19937_64 rng(99);
  for (int round = 0; round < 100000; ++round) {
    const double d = std::bit_cast<double>(std::uniform_int_distribution<std::uint64_t>()(rng));
    if (!std::isfinite(d)) continue;
    const std::string s = format_json_number(d);
    double back = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), back);
    ASSERT_EQ(r.ec, std::errc()) << s;
    ASSERT_EQ(back, d) << s;
    ASSERT_EQ(canon(s), s);
  }
}

}  // namespace
}  // namespace idem
