// Images for the server's tests (image_globals_test.cpp, image_cache_test.cpp): a small ELF64
// cubin builder with given sections, and a fat-binary container builder with entries of given
// kind, architecture and compression (layouts: docs/private-tables.md, "Fat binaries"). Only what
// the server's image checks read is filled in.
#pragma once

#include <elf.h>
#include <lz4.h>
#include <zstd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mpsshim::server::test {

using Buffer = std::vector<std::byte>;

// Entry header fields, from the entry's start.
constexpr std::size_t kEntryKind = 0;
constexpr std::size_t kEntryHeaderSize = 4;
constexpr std::size_t kEntryCompressedSize = 16;
constexpr std::size_t kEntryFlags = 40;
constexpr std::size_t kEntryUncompressedSize = 56;
// The first entry of a container, from the container's start.
constexpr std::size_t kFirstEntry = 16;

constexpr std::uint16_t kPtx = 1;
constexpr std::uint16_t kElf = 2;
constexpr std::uint64_t kPlainFlags = 0x11;  // 64-bit, Linux host: what nvcc writes
constexpr std::uint64_t kOldCompression = 0x1000;
constexpr std::uint64_t kLz4 = 0x2000;
constexpr std::uint64_t kZstd = 0x8000;

template <typename T>
void put(Buffer& bytes, std::size_t at, T value) {
  if (bytes.size() < at + sizeof value) bytes.resize(at + sizeof value);
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

template <typename T>
T get(const Buffer& bytes, std::size_t at) {
  T value{};
  std::memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}

inline void append(Buffer& to, std::span<const std::byte> bytes) {
  to.insert(to.end(), bytes.begin(), bytes.end());
}

inline Buffer text_bytes(std::string_view text) {
  Buffer out;
  for (char c : text) out.push_back(static_cast<std::byte>(c));
  return out;
}

// PTX as a bare image: NUL-terminated.
inline Buffer ptx_image(std::string_view text) {
  Buffer out = text_bytes(text);
  out.push_back(std::byte{0});
  return out;
}

// ---- A tiny ELF64 cubin builder ----------------------------------------------------------------

struct Section {
  std::string name;
  std::uint32_t type = SHT_PROGBITS;
};

// What nvcc 13 writes for a kernel with parameters and __shared__ memory only, plus the other
// sections the scan must let through.
inline const std::vector<Section> kCleanSections = {
    {".strtab", SHT_STRTAB},
    {".symtab", SHT_SYMTAB},
    {".debug_frame", SHT_PROGBITS},
    {".nv.info", SHT_LOPROC},
    {".nv.info._Z1kPfi", SHT_LOPROC},
    {".nv.callgraph", SHT_LOPROC + 1},
    {".rela.text._Z1kPfi", SHT_RELA},
    {".rela.nv.constant4", SHT_RELA},
    {".nv.constant2", SHT_PROGBITS},
    {".nv.constant4", SHT_PROGBITS},
    {".text._Z1kPfi", SHT_PROGBITS},
    {".nv.shared._Z1kPfi", SHT_NOBITS},
    {".nv.shared.reserved.0", SHT_NOBITS},
    {".nv.constant0._Z1kPfi", SHT_PROGBITS},
    {".nv.merc.nv.constant.pic", SHT_PROGBITS},
};

constexpr std::size_t kSectionBodyBytes = 24;
constexpr std::uint64_t kNobitsBytes = 0x10000;  // far more than the file: NOBITS has no bytes

// Layout: ELF header, section-name table (section 1), section bodies, section headers (last,
// so any cut-short copy loses some of them).
inline Buffer make_elf(const std::vector<Section>& sections) {
  std::string names(1, '\0');
  auto add_name = [&names](std::string_view name) {
    auto at = static_cast<std::uint32_t>(names.size());
    names += name;
    names += '\0';
    return at;
  };
  std::vector<Elf64_Shdr> headers(2 + sections.size(), Elf64_Shdr{});
  Buffer elf(sizeof(Elf64_Ehdr));
  headers[1].sh_name = add_name(".shstrtab");
  for (std::size_t i = 0; i < sections.size(); ++i) {
    headers[2 + i].sh_name = add_name(sections[i].name);
  }
  headers[1].sh_type = SHT_STRTAB;
  headers[1].sh_offset = elf.size();
  headers[1].sh_size = names.size();
  headers[1].sh_addralign = 1;
  append(elf, text_bytes(names));
  for (std::size_t i = 0; i < sections.size(); ++i) {
    Elf64_Shdr& header = headers[2 + i];
    header.sh_type = sections[i].type;
    header.sh_offset = elf.size();
    header.sh_addralign = 1;
    if (sections[i].type == SHT_NOBITS) {
      header.sh_size = kNobitsBytes;
    } else if (sections[i].type == SHT_SYMTAB) {
      // One null symbol, naming nothing; its names are the first section's (.strtab).
      header.sh_size = sizeof(Elf64_Sym);
      header.sh_entsize = sizeof(Elf64_Sym);
      header.sh_link = 2;
      elf.resize(elf.size() + sizeof(Elf64_Sym), std::byte{0});
    } else {
      header.sh_size = kSectionBodyBytes;
      elf.resize(elf.size() + kSectionBodyBytes, std::byte{0xAB});
    }
  }
  elf.resize((elf.size() + 7) / 8 * 8);
  Elf64_Ehdr header{};
  std::memcpy(header.e_ident, ELFMAG, SELFMAG);
  header.e_ident[EI_CLASS] = ELFCLASS64;
  header.e_ident[EI_DATA] = ELFDATA2LSB;
  header.e_ident[EI_VERSION] = EV_CURRENT;
  header.e_type = ET_EXEC;
  header.e_machine = EM_CUDA;
  header.e_version = EV_CURRENT;
  header.e_shoff = elf.size();
  header.e_ehsize = sizeof(Elf64_Ehdr);
  header.e_shentsize = sizeof(Elf64_Shdr);
  header.e_shnum = static_cast<std::uint16_t>(headers.size());
  header.e_shstrndx = 1;
  for (const Elf64_Shdr& section : headers) put(elf, elf.size(), section);
  put(elf, 0, header);
  return elf;
}

inline Buffer clean_elf() {
  return make_elf(kCleanSections);
}

inline Buffer elf_with(std::string name, std::uint32_t type = SHT_PROGBITS) {
  auto sections = kCleanSections;
  sections.push_back({std::move(name), type});
  return make_elf(sections);
}

inline std::size_t section_header_at(const Buffer& elf, std::size_t index) {
  return get<std::uint64_t>(elf, offsetof(Elf64_Ehdr, e_shoff)) + index * sizeof(Elf64_Shdr);
}

// ---- A fat-binary container builder ------------------------------------------------------------

enum class Packing { kNone, kLz4, kZstd };

inline Buffer lz4(const Buffer& raw) {
  Buffer out(static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(raw.size()))));
  int size = LZ4_compress_default(reinterpret_cast<const char*>(raw.data()),
                                  reinterpret_cast<char*>(out.data()), static_cast<int>(raw.size()),
                                  static_cast<int>(out.size()));
  REQUIRE(size > 0);
  out.resize(static_cast<std::size_t>(size));
  return out;
}

inline Buffer zstd(const Buffer& raw) {
  Buffer out(ZSTD_compressBound(raw.size()));
  std::size_t size = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 3);
  REQUIRE_FALSE(ZSTD_isError(size));
  out.resize(size);
  return out;
}

struct EntrySpec {
  std::uint16_t kind = kElf;
  Buffer raw;  // the ELF or the PTX text (no NUL: padding supplies it, as nvcc's does)
  Packing packing = Packing::kNone;
  std::uint32_t arch = 90;
  std::uint32_t header_size = 64;  // nvcc: 64, 80 (PTX), 112 (sm_100+ ELF)
};

// Header, then the payload padded to 8 bytes like nvcc's.
inline Buffer make_entry(const EntrySpec& spec) {
  Buffer data = spec.packing == Packing::kLz4    ? lz4(spec.raw)
                : spec.packing == Packing::kZstd ? zstd(spec.raw)
                                                 : spec.raw;
  std::size_t padded = (data.size() + 8) / 8 * 8;  // at least one NUL after PTX text
  Buffer entry(spec.header_size);
  put<std::uint16_t>(entry, kEntryKind, spec.kind);
  put<std::uint16_t>(entry, 2, 0x0101);
  put<std::uint32_t>(entry, kEntryHeaderSize, spec.header_size);
  put<std::uint64_t>(entry, 8, padded);
  put<std::uint32_t>(entry, 28, spec.arch);
  std::uint64_t flags = kPlainFlags;
  if (spec.packing != Packing::kNone) {
    flags |= spec.packing == Packing::kLz4 ? kLz4 : kZstd;
    put<std::uint32_t>(entry, kEntryCompressedSize, static_cast<std::uint32_t>(data.size()));
    put<std::uint64_t>(entry, kEntryUncompressedSize, spec.raw.size());
  }
  put<std::uint64_t>(entry, kEntryFlags, flags);
  append(entry, data);
  entry.resize(spec.header_size + padded);
  return entry;
}

inline Buffer make_container(const std::vector<EntrySpec>& specs) {
  Buffer container(16);
  put<std::uint32_t>(container, 0, 0xBA55ED50u);
  put<std::uint16_t>(container, 4, 1);
  put<std::uint16_t>(container, 6, 16);
  for (const EntrySpec& spec : specs) append(container, make_entry(spec));
  put<std::uint64_t>(container, 8, container.size() - 16);
  return container;
}

inline Buffer concat(const Buffer& a, const Buffer& b) {
  Buffer out = a;
  append(out, b);
  return out;
}

}  // namespace mpsshim::server::test
