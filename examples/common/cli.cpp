#include "examples/common/cli.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "examples/common/check.hpp"

namespace mpsshim::examples {

Cli::Cli(int argc, char** argv, std::string usage) : usage_(std::move(usage)) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s %s\n", program_name(), usage_.c_str());
      std::exit(EXIT_SUCCESS);
    }
    if (!arg.starts_with("--") || arg.size() == 2) usage_error(arg, "is not an option");
    Option option;
    const auto equals = arg.find('=');
    if (equals != std::string_view::npos) {
      option.name = arg.substr(0, equals);
      option.value = arg.substr(equals + 1);
      option.has_value = true;
    } else {
      option.name = arg;
      // No option takes a value starting with "--", so the next word is this option's value
      // unless it is itself an option.
      if (i + 1 < argc && !std::string_view(argv[i + 1]).starts_with("--")) {
        option.value = argv[++i];
        option.has_value = true;
      }
    }
    options_.push_back(std::move(option));
  }
}

Cli::Option* Cli::find(std::string_view name) {
  Option* found = nullptr;
  for (auto& option : options_) {
    if (option.name == name) {
      option.used = true;
      found = &option;  // the last occurrence wins, as in most tools
    }
  }
  return found;
}

bool Cli::parse_integer(std::string_view text, long long& value) {
  const std::string copy(text);
  if (copy.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(copy.c_str(), &end, 0);
  if (errno != 0 || end == copy.c_str()) return false;
  const std::string_view suffix(end);
  long long scale = 1;
  if (suffix == "K" || suffix == "k") {
    scale = 1LL << 10;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1LL << 20;
  } else if (suffix == "G" || suffix == "g") {
    scale = 1LL << 30;
  } else if (!suffix.empty()) {
    return false;
  }
  if (__builtin_mul_overflow(parsed, scale, &parsed)) return false;
  value = parsed;
  return true;
}

long long Cli::integer(std::string_view name, long long fallback, long long min, long long max) {
  const Option* option = find(name);
  if (option == nullptr) return fallback;
  long long value = 0;
  if (!option->has_value || !parse_integer(option->value, value) || value < min || value > max) {
    usage_error(name, "needs an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                          "], got '" + option->value + "'");
  }
  return value;
}

bool Cli::flag(std::string_view name) {
  const Option* option = find(name);
  if (option == nullptr) return false;
  if (option->has_value) usage_error(name, "takes no value");
  return true;
}

std::string Cli::text(std::string_view name, std::string_view fallback) {
  const Option* option = find(name);
  if (option == nullptr) return std::string(fallback);
  if (!option->has_value) usage_error(name, "needs a value");
  return option->value;
}

void Cli::finish() const {
  for (const auto& option : options_) {
    if (!option.used) usage_error(option.name, "is not an option of this program");
  }
}

void Cli::usage_error(std::string_view option, std::string_view problem) const {
  std::fprintf(stderr, "%s: %.*s %.*s\nusage: %s %s\n", program_name(),
               static_cast<int>(option.size()), option.data(), static_cast<int>(problem.size()),
               problem.data(), program_name(), usage_.c_str());
  std::printf("%s: usage_error=%.*s FAIL\n", program_name(), static_cast<int>(option.size()),
              option.data());
  std::fflush(stderr);
  std::fflush(stdout);
  std::exit(2);
}

}  // namespace mpsshim::examples
