#include "tests/entry/procaddr_tsv.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mpsshim::test {
namespace {

ProcAddressTsv read(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot open ") + path);
  ProcAddressTsv tsv;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.front() == '#') continue;
    std::istringstream fields(line);
    std::string name;
    int flags = 0;
    Breakpoint breakpoint;
    if (!(fields >> name >> flags >> breakpoint.min_version >> breakpoint.symbol)) {
      throw std::runtime_error("malformed row: " + line);
    }
    tsv.breakpoints[{name, flags}].push_back(breakpoint);
    ++tsv.row_count;
  }
  return tsv;
}

}  // namespace

const ProcAddressTsv& procaddr_tsv() {
  static const ProcAddressTsv tsv = [] {
    const char* path = std::getenv("MPSSHIM_TEST_PROCADDR_TSV");
    if (path == nullptr) throw std::runtime_error("MPSSHIM_TEST_PROCADDR_TSV is not set");
    return read(path);
  }();
  return tsv;
}

}  // namespace mpsshim::test
