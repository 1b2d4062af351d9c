// Command-line options of the example and benchmark programs: "--name value", "--name=value"
// and bare flags. Integers accept 0x prefixes and K/M/G (binary) suffixes: --n 1M, --size 64M.
//
// A malformed or unknown option prints the problem and the usage on stderr and
// "<program>: usage_error=<option> FAIL" on stdout, and exits 2; --help prints the usage, exits 0.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mpsshim::examples {

class Cli {
 public:
  Cli(int argc, char** argv, std::string usage);

  long long integer(std::string_view name, long long fallback, long long min, long long max);
  bool flag(std::string_view name);
  std::string text(std::string_view name, std::string_view fallback);

  // Rejects the options no getter asked for; call after the last getter.
  void finish() const;

  // Parses one integer the way integer() does; false when `text` is not one.
  static bool parse_integer(std::string_view text, long long& value);

 private:
  struct Option {
    std::string name;
    std::string value;
    bool has_value = false;
    bool used = false;
  };
  Option* find(std::string_view name);
  // Names the option on stdout (one word) and the problem on stderr; exits 2.
  [[noreturn]] void usage_error(std::string_view option, std::string_view problem) const;

  std::string usage_;
  std::vector<Option> options_;
};

}  // namespace mpsshim::examples
