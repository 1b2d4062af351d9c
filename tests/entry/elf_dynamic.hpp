// What the dynamic linker sees of a shared library: its SONAME and the symbols it defines.
#pragma once

#include <set>
#include <string>

namespace mpsshim::test {

struct ElfDynamic {
  std::string soname;
  std::set<std::string> defined_symbols;        // .dynsym entries with a section
  std::set<std::string> defined_non_functions;  // ... of which not STT_FUNC
};

// Parses a 64-bit little-endian ELF file; throws std::runtime_error on anything else.
ElfDynamic read_elf_dynamic(const std::string& path);

}  // namespace mpsshim::test
