#include "tests/entry/elf_dynamic.hpp"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace mpsshim::test {
namespace {

template <typename T>
T read_at(const std::vector<char>& image, std::size_t offset) {
  if (offset + sizeof(T) > image.size()) throw std::runtime_error("ELF read past end");
  T value;
  std::memcpy(&value, image.data() + offset, sizeof value);
  return value;
}

std::string string_at(const std::vector<char>& image, const Elf64_Shdr& strtab, std::size_t index) {
  const std::size_t offset = strtab.sh_offset + index;
  if (index >= strtab.sh_size || offset >= image.size()) throw std::runtime_error("bad string");
  return std::string(image.data() + offset, strnlen(image.data() + offset, strtab.sh_size - index));
}

}  // namespace

ElfDynamic read_elf_dynamic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> image{std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>()};
  const auto header = read_at<Elf64_Ehdr>(image, 0);
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
      header.e_ident[EI_DATA] != ELFDATA2LSB) {
    throw std::runtime_error(path + " is not a 64-bit little-endian ELF file");
  }
  std::vector<Elf64_Shdr> sections;
  for (std::size_t i = 0; i < header.e_shnum; ++i) {
    sections.push_back(read_at<Elf64_Shdr>(image, header.e_shoff + i * header.e_shentsize));
  }

  ElfDynamic result;
  for (const Elf64_Shdr& section : sections) {
    if (section.sh_link >= sections.size()) continue;
    const Elf64_Shdr& strtab = sections[section.sh_link];
    if (section.sh_type == SHT_DYNSYM) {
      for (std::size_t i = 1; i < section.sh_size / sizeof(Elf64_Sym); ++i) {
        const auto symbol = read_at<Elf64_Sym>(image, section.sh_offset + i * sizeof(Elf64_Sym));
        if (symbol.st_shndx == SHN_UNDEF) continue;
        const std::string name = string_at(image, strtab, symbol.st_name);
        result.defined_symbols.insert(name);
        if (ELF64_ST_TYPE(symbol.st_info) != STT_FUNC) result.defined_non_functions.insert(name);
      }
    } else if (section.sh_type == SHT_DYNAMIC) {
      for (std::size_t i = 0; i < section.sh_size / sizeof(Elf64_Dyn); ++i) {
        const auto entry = read_at<Elf64_Dyn>(image, section.sh_offset + i * sizeof(Elf64_Dyn));
        if (entry.d_tag == DT_SONAME) result.soname = string_at(image, strtab, entry.d_un.d_val);
      }
    }
  }
  return result;
}

}  // namespace mpsshim::test
