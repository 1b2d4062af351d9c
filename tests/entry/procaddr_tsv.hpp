// The real driver's cuGetProcAddress table, read independently of the generator so that the
// test checks the shim against the data rather than against the generator's reading of it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mpsshim::test {

struct Breakpoint {
  int min_version;
  std::string symbol;
};

struct ProcAddressTsv {
  // (base name, flags) -> breakpoints in ascending version.
  std::map<std::pair<std::string, int>, std::vector<Breakpoint>> breakpoints;
  std::size_t row_count = 0;
};

// Reads MPSSHIM_TEST_PROCADDR_TSV.
const ProcAddressTsv& procaddr_tsv();

}  // namespace mpsshim::test
