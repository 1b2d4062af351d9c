// Small images for the server's tests: an ELF64 cubin with given section names, and one
// fat-binary container holding one entry (layouts: dark-api.md §5). Only what the server's
// image checks read is filled in.
#pragma once

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace mpsshim::server::test {

// An ELF64 cubin whose sections (after the null one and the name table) have these names; each
// is 16 bytes of PROGBITS, except names starting with ".nv.global" which are NOBITS as nvcc
// makes uninitialized __device__ variables.
inline std::vector<std::byte> elf_with_sections(std::initializer_list<std::string> names) {
  std::string strtab(1, '\0');
  std::vector<std::uint32_t> name_offsets;
  for (const std::string& n : names) {
    name_offsets.push_back(static_cast<std::uint32_t>(strtab.size()));
    strtab += n;
    strtab += '\0';
  }
  const std::uint32_t shstrtab_name = static_cast<std::uint32_t>(strtab.size());
  strtab += ".shstrtab";
  strtab += '\0';
  const std::size_t section_count = names.size() + 2;
  const std::size_t data_offset = sizeof(Elf64_Ehdr);
  const std::size_t data_bytes = 16 * names.size();
  const std::size_t strtab_offset = data_offset + data_bytes;
  const std::size_t shoff = (strtab_offset + strtab.size() + 7) & ~std::size_t{7};
  std::vector<std::byte> out(shoff + section_count * sizeof(Elf64_Shdr));

  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_EXEC;
  eh.e_machine = 190;  // EM_CUDA
  eh.e_version = EV_CURRENT;
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_shoff = shoff;
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = static_cast<Elf64_Half>(section_count);
  eh.e_shstrndx = static_cast<Elf64_Half>(section_count - 1);
  std::memcpy(out.data(), &eh, sizeof eh);
  std::memcpy(out.data() + strtab_offset, strtab.data(), strtab.size());

  std::vector<Elf64_Shdr> sections(section_count);
  std::size_t i = 1;
  for (const std::string& n : names) {
    Elf64_Shdr& s = sections[i];
    s.sh_name = name_offsets[i - 1];
    s.sh_type = n.rfind(".nv.global", 0) == 0 && n.find(".init") == std::string::npos
                    ? SHT_NOBITS
                    : SHT_PROGBITS;
    s.sh_offset = data_offset + 16 * (i - 1);
    s.sh_size = 16;
    ++i;
  }
  Elf64_Shdr& names_section = sections[section_count - 1];
  names_section.sh_name = shstrtab_name;
  names_section.sh_type = SHT_STRTAB;
  names_section.sh_offset = strtab_offset;
  names_section.sh_size = strtab.size();
  std::memcpy(out.data() + shoff, sections.data(), sections.size() * sizeof(Elf64_Shdr));
  return out;
}

// One fat-binary container with one uncompressed entry of `kind` (1 PTX, 2 ELF) for sm_90.
inline std::vector<std::byte> fatbin_with_entry(std::uint16_t kind,
                                                std::span<const std::byte> payload) {
  constexpr std::uint32_t kEntryHeader = 64;
  const std::uint64_t padded = (payload.size() + 7) & ~std::uint64_t{7};
  const std::uint64_t fat_size = kEntryHeader + padded;
  std::vector<std::byte> out(16 + fat_size);
  auto put = [&](std::size_t at, auto value) {
    std::memcpy(out.data() + at, &value, sizeof value);
  };
  put(0, std::uint32_t{0xBA55ED50u});
  put(4, std::uint16_t{1});
  put(6, std::uint16_t{16});
  put(8, fat_size);
  const std::size_t e = 16;
  put(e + 0, kind);
  put(e + 2, std::uint16_t{0x0101});
  put(e + 4, kEntryHeader);
  put(e + 8, padded);
  put(e + 28, std::uint32_t{90});
  put(e + 40, std::uint64_t{0x11});  // 64-bit, Linux
  put(e + 56, std::uint64_t{payload.size()});
  std::memcpy(out.data() + e + kEntryHeader, payload.data(), payload.size());
  return out;
}

inline std::vector<std::byte> fatbin_with_elf_entry(std::initializer_list<std::string> names) {
  const std::vector<std::byte> elf = elf_with_sections(names);
  return fatbin_with_entry(2, elf);
}

}  // namespace mpsshim::server::test
