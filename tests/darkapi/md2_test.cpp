// MD2 and HMAC-MD2 against RFC 1319's vectors and the intermediate states ZLUDA's unit tests
// pin down (docs/private-tables.md, "The hash" and "Test vectors").
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <string_view>

#include "libshim/darkapi/hmac_md2.hpp"
#include "libshim/darkapi/integrity.hpp"
#include "libshim/darkapi/md2.hpp"
#include "tests/darkapi/hex.hpp"

using mpsshim::shim::hmac_md2;
using mpsshim::shim::kIntegrityKey;
using mpsshim::shim::Md2;
using mpsshim::shim::md2;
using mpsshim::test::bytes_of;
using mpsshim::test::to_hex;

TEST_CASE("MD2 reproduces the RFC 1319 test suite", "[md2]") {
  const auto hash = [](std::string_view text) { return to_hex(md2(bytes_of(text))); };
  CHECK(hash("") == "8350e5a3e24c153df2275c9f80692773");
  CHECK(hash("a") == "32ec01ec4a6dac72c0ab96fb34c0b5d1");
  CHECK(hash("abc") == "da853b0d3f88d99b30283a69e6ded6bb");
  CHECK(hash("message digest") == "ab4f496bfb2a530b219ff33031fe06b0");
  CHECK(hash("abcdefghijklmnopqrstuvwxyz") == "4e8ddff3650292ab5a4108c3aa47940b");
  CHECK(hash("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") ==
        "da33def2a42df13975352846c30338cd");
  std::string eighty;
  for (int i = 0; i < 8; ++i) eighty += "1234567890";
  CHECK(hash(eighty) == "d5976f79d83d3a0dc9806c3c66f3efd8");
}

TEST_CASE("MD2 gives the same digest fed byte by byte or at once", "[md2]") {
  constexpr std::string_view kText = "a message longer than one sixteen-byte MD2 block";
  Md2 bytewise;
  for (const char c : kText) bytewise.update(static_cast<std::uint8_t>(c));
  CHECK(bytewise.finish() == md2(bytes_of(kText)));
}

TEST_CASE("MD2 state after absorbing K^0x36 matches ZLUDA's vector", "[md2]") {
  Md2 h;
  for (const std::uint8_t b : kIntegrityKey) h.update(static_cast<std::uint8_t>(b ^ 0x36));
  // state | block | state^block | checksum | n = 0 | L = 0x3d
  CHECK(to_hex(h.state()) ==
        "8b219a49e86d1aeef237f9b54a8c3c75c71eee21cf298ae51383f4ec3304e2fd"
        "b02f09014ff7686d6946437eb62b21ed57a110860e60441e705f67d1eb67a13d003d");
}

TEST_CASE("HMAC-MD2 of the empty message under the integrity key", "[md2]") {
  CHECK(to_hex(hmac_md2(kIntegrityKey, {})) == "f66b07aba4a875ea140c2cc013a41c6a");
}
