#include "broker/server/images/image_globals.hpp"

#include "proto/image_extent.hpp"

#include <elf.h>
#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <new>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace mpsshim::server {
namespace {

// Every format here is little-endian and read with memcpy into host integers and <elf.h> structs.
static_assert(std::endian::native == std::endian::little);
static_assert(sizeof(Elf64_Ehdr) == 64 && sizeof(Elf64_Shdr) == 64);

using Bytes = std::span<const std::byte>;

constexpr std::uint32_t kFatbinMagic = proto::kFatbinContainerMagic;
constexpr std::uint32_t kFatbinWrapperMagic = proto::kFatbinWrapperMagic;  // not an image
constexpr std::uint32_t kElfMagic = 0x464C457Fu;                           // "\x7fELF"
constexpr std::uint16_t kFatbinVersion = 1;
constexpr std::uint16_t kFatbinHeaderBytes = 16;
constexpr std::uint32_t kEntryBaseBytes = 64;
constexpr std::uint16_t kKindPtx = 1;
constexpr std::uint16_t kKindElf = 2;
constexpr std::uint64_t kFlagOldCompression = 0x1000;
constexpr std::uint64_t kFlagLz4 = 0x2000;
constexpr std::uint64_t kFlagZstd = 0x8000;
// Decompression bombs: a client must not make the server allocate more than this per entry,
// nor much more than it sent.
constexpr std::uint64_t kMaxUncompressedBytes = std::uint64_t{512} << 20;
constexpr std::uint64_t kMaxCompressionRatio = 256;
// Names and lines quoted in a reason come from the client: bounded so a log line stays a line.
constexpr std::size_t kQuoteMax = 64;

template <typename T>
bool read_at(Bytes bytes, std::uint64_t offset, T& out) {
  if (offset > bytes.size() || sizeof(T) > bytes.size() - offset) return false;
  std::memcpy(&out, bytes.data() + offset, sizeof(T));
  return true;
}

// Whether [offset, offset + size) lies inside `bytes`, without overflow.
bool fits(Bytes bytes, std::uint64_t offset, std::uint64_t size) {
  return offset <= bytes.size() && size <= bytes.size() - offset;
}

GlobalsScan refuse(std::string reason) {
  return GlobalsScan{false, std::move(reason)};
}
GlobalsScan shareable() {
  return GlobalsScan{true, {}};
}

// Prefixes a refusal's reason with where it was found.
GlobalsScan located(std::string_view where, GlobalsScan scan) {
  if (!scan.shareable) scan.reason.insert(0, where);
  return scan;
}

std::string quote(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, kQuoteMax)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (text.size() > kQuoteMax) out += "...";
  return out;
}

// ---- ELF cubins ------------------------------------------------------------------------------

// Sections that hold state one session could change for another: .nv.global (uninitialized
// __device__ and __managed__ variables, NOBITS), .nv.global.init (initialized ones),
// .nv.constant3 (user __constant__ data, writable through cuLibraryGetGlobal) and anything
// naming managed memory. sm_100+ cubins repeat sections under ".nv.merc." for later
// finalization (".nv.merc.nv.global.init", and ".nv.merc.nv.constant.user" for bank 3): the
// same rules apply to what follows the prefix.
bool holds_session_state(std::string_view name) {
  constexpr std::string_view kMercuryPrefix = ".nv.merc";
  std::string_view base = name;
  if (base.starts_with(".nv.merc.")) base.remove_prefix(kMercuryPrefix.size());
  return base.starts_with(".nv.global") || base.starts_with(".nv.constant3") ||
         base.starts_with(".nv.constant.user") || name.find("managed") != std::string_view::npos;
}

// Where the section headers are, how many, and which one holds their names, after ELF
// extended numbering (count in section 0's sh_size, name index in its sh_link).
struct SectionTable {
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
  std::uint64_t names = 0;
};

// Empty when the header is one this scan understands, else why not.
std::string check_elf_header(Bytes elf, Elf64_Ehdr& header) {
  if (!read_at(elf, 0, header)) return "ELF header cut short";
  if (header.e_ident[EI_CLASS] != ELFCLASS64) return "not a 64-bit ELF";
  if (header.e_ident[EI_DATA] != ELFDATA2LSB) return "not a little-endian ELF";
  if (header.e_machine != EM_CUDA) return "ELF machine " + std::to_string(header.e_machine);
  if (header.e_shentsize != sizeof(Elf64_Shdr)) {
    return "ELF section header size " + std::to_string(header.e_shentsize);
  }
  return {};
}

std::string locate_sections(Bytes elf, const Elf64_Ehdr& header, SectionTable& table) {
  // Without section headers nothing says where variables live.
  if (header.e_shoff == 0) return "ELF without section headers";
  table = {header.e_shoff, header.e_shnum, header.e_shstrndx};
  if (table.count == 0 || table.names == SHN_XINDEX) {
    Elf64_Shdr first{};
    if (!read_at(elf, table.offset, first)) return "ELF section headers out of bounds";
    if (table.count == 0) table.count = first.sh_size;
    if (table.names == SHN_XINDEX) table.names = first.sh_link;
  }
  if (table.count == 0) return "ELF without sections";
  if (table.offset > elf.size() || table.count > (elf.size() - table.offset) / sizeof(Elf64_Shdr)) {
    return "ELF section headers out of bounds";
  }
  if (table.names == SHN_UNDEF || table.names >= table.count) {
    return "ELF section name table index out of range";
  }
  return {};
}

// Within bounds: locate_sections checked the whole table.
Elf64_Shdr section_at(Bytes elf, const SectionTable& table, std::uint64_t index) {
  Elf64_Shdr section{};
  read_at(elf, table.offset + index * sizeof(Elf64_Shdr), section);
  return section;
}

// The NUL-terminated name at `offset`, or nullopt when it starts or runs past the table's end.
std::optional<std::string_view> section_name(Bytes names, std::uint32_t offset) {
  if (offset >= names.size()) return std::nullopt;
  auto begin = names.begin() + offset;
  auto nul = std::find(begin, names.end(), std::byte{0});
  if (nul == names.end()) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(&*begin),
                          static_cast<std::size_t>(nul - begin));
}

// A section of variables (holds_session_state, but for managed memory, which is refused
// outright): shareable only if every variable in it is one of is_read_only_by_contract's.
bool is_variable_section(std::string_view name) {
  if (name.starts_with(".nv.merc.")) name.remove_prefix(std::string_view(".nv.merc").size());
  return name.find("managed") == std::string_view::npos &&
         (name.starts_with(".nv.global") || name.starts_with(".nv.constant3") ||
          name.starts_with(".nv.constant.user"));
}

// Variables that no defined program writes and every instance of an image holds with the same
// bytes: nvcc's string literals (is_string_literal_name), the tables of CUDA's math library
// (const), and the tables curand_kernel.h defines (static, initialized) in every translation
// unit that includes it, which curand's device code only reads. 372 of libtorch_cuda.so's 444
// images hold curand's tables.
bool is_read_only_by_contract(std::string_view name) {
  static constexpr std::string_view kTables[] = {
      // CUDA's math library: argument reduction of sinf/cosf/tanf and sin/cos coefficients.
      "__cudart_i2opi_f", "__cudart_i2opi_d", "__cudart_sin_cos_coeffs",
      // curand_kernel.h
      "precalc_xorwow_matrix", "precalc_xorwow_offset_matrix", "mrg32k3aM1", "mrg32k3aM1SubSeq",
      "mrg32k3aM1Seq", "mrg32k3aM2", "mrg32k3aM2SubSeq", "mrg32k3aM2Seq", "__cr_lgamma_table"};
  return is_string_literal_name(name) ||
         std::find(std::begin(kTables), std::end(kTables), name) != std::end(kTables);
}

// The tag objects of CUDA's C++ libraries: `inline constexpr` objects of empty types (libcu++'s
// customization points such as cuda::std::ranges::begin, cuda::std::in_place, cute::_,
// thrust::seq) that nvcc emits as one-byte device variables of internal linkage in every
// translation unit that includes the headers: `_ZN<n>_INTERNAL_<unit>` then a name in
// cuda::std, cute, thrust or cub. Const and empty: nothing to write, nothing to read.
// libtorch_cuda.so's images hold dozens each.
bool is_library_tag_object(std::string_view name, std::uint64_t size) {
  if (size > 1 || !name.starts_with("_ZN")) return false;
  name.remove_prefix(3);
  std::size_t length = 0;
  std::size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9' && digits < 4) {
    length = length * 10 + static_cast<std::size_t>(name[digits] - '0');
    ++digits;
  }
  if (digits == 0 || length > name.size() - digits) return false;
  const std::string_view unit = name.substr(digits, length);
  if (!unit.starts_with("_INTERNAL_")) return false;
  const std::string_view rest = name.substr(digits + length);
  return rest.starts_with("4cuda3std") || rest.starts_with("4cute") ||
         rest.starts_with("6thrust") || rest.starts_with("3cub");
}

// Whether every symbol defined in one of `sections` is local and read-only by contract
// (is_read_only_by_contract), or a section symbol. Empty when so, else why not.
struct VariableSection {
  std::uint64_t index;
  std::string_view name;
  std::size_t symbols = 0;
};

// `symbol_tables`: the .symtab, and on sm_100+ the .nv.merc.symtab (a processor-specific type)
// that names the .nv.merc. copies of the variable sections.
std::string only_read_only_variables(Bytes elf, const SectionTable& table,
                                     const std::vector<std::uint64_t>& symbol_tables,
                                     std::vector<VariableSection>& sections) {
  bool found = false;
  for (std::uint64_t i : symbol_tables) {
    Elf64_Shdr symtab{};
    read_at(elf, table.offset + i * sizeof(Elf64_Shdr), symtab);
    if (symtab.sh_entsize != sizeof(Elf64_Sym) || symtab.sh_link >= table.count ||
        !fits(elf, symtab.sh_offset, symtab.sh_size)) {
      return "ELF symbol table malformed";
    }
    Elf64_Shdr strtab{};
    read_at(elf, table.offset + symtab.sh_link * sizeof(Elf64_Shdr), strtab);
    if (strtab.sh_type != SHT_STRTAB || !fits(elf, strtab.sh_offset, strtab.sh_size)) {
      return "ELF symbol names malformed";
    }
    Bytes names = elf.subspan(strtab.sh_offset, strtab.sh_size);
    for (std::uint64_t at = 0; at + sizeof(Elf64_Sym) <= symtab.sh_size; at += sizeof(Elf64_Sym)) {
      Elf64_Sym symbol{};
      read_at(elf, symtab.sh_offset + at, symbol);
      auto section = std::find_if(sections.begin(), sections.end(), [&](const VariableSection& s) {
        return s.index == symbol.st_shndx;
      });
      if (section == sections.end() || ELF64_ST_TYPE(symbol.st_info) == STT_SECTION) continue;
      auto name = section_name(names, symbol.st_name);
      if (!name) return "ELF symbol name malformed";
      if (ELF64_ST_BIND(symbol.st_info) != STB_LOCAL ||
          !(is_read_only_by_contract(*name) || is_library_tag_object(*name, symbol.st_size))) {
        return "variable " + quote(*name) + " in section " + quote(section->name);
      }
      ++section->symbols;
    }
    found = true;
  }
  // Bytes no symbol names are not something this scan understands.
  for (const VariableSection& section : sections) {
    if (!found || section.symbols == 0) return "section " + quote(section.name);
  }
  return {};
}

GlobalsScan scan_elf(Bytes elf) {
  Elf64_Ehdr header{};
  if (auto problem = check_elf_header(elf, header); !problem.empty()) return refuse(problem);
  SectionTable table;
  if (auto problem = locate_sections(elf, header, table); !problem.empty()) {
    return refuse(problem);
  }
  Elf64_Shdr names_header = section_at(elf, table, table.names);
  if (names_header.sh_type != SHT_STRTAB ||
      !fits(elf, names_header.sh_offset, names_header.sh_size)) {
    return refuse("ELF section name table malformed");
  }
  Bytes names = elf.subspan(names_header.sh_offset, names_header.sh_size);
  std::vector<VariableSection> variable_sections;  // variables: read-only by contract, or refused
  std::vector<std::uint64_t> symbol_tables;
  for (std::uint64_t i = 0; i < table.count; ++i) {
    Elf64_Shdr section = section_at(elf, table, i);
    // NOBITS sections occupy no file bytes; every other one must lie inside what was sent.
    if (section.sh_type != SHT_NOBITS && !fits(elf, section.sh_offset, section.sh_size)) {
      return refuse("ELF section " + std::to_string(i) + " out of bounds");
    }
    auto name = section_name(names, section.sh_name);
    if (!name) return refuse("ELF section " + std::to_string(i) + " name malformed");
    if (section.sh_type == SHT_SYMTAB || *name == ".nv.merc.symtab") symbol_tables.push_back(i);
    if (is_variable_section(*name)) {
      variable_sections.push_back({i, *name});
    } else if (holds_session_state(*name)) {
      return refuse("section " + quote(*name));
    }
  }
  if (!variable_sections.empty()) {
    if (auto problem = only_read_only_variables(elf, table, symbol_tables, variable_sections);
        !problem.empty()) {
      return refuse(problem);
    }
  }
  return shareable();
}

// ---- PTX text --------------------------------------------------------------------------------

// Control characters other than whitespace mean binary data, not PTX. Bytes >= 0x80 pass:
// UTF-8 may appear in comments and file names.
bool looks_like_text(std::string_view text) {
  return std::none_of(text.begin(), text.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') || u == 0x7f;
  });
}

// The text up to the first NUL, or to the end when `need_nul` is false (an entry's payload
// has a size; a bare image is read by the driver up to its terminator). nullopt when it is
// missing, empty or not text.
std::optional<std::string_view> ptx_text(Bytes bytes, bool need_nul) {
  auto nul = std::find(bytes.begin(), bytes.end(), std::byte{0});
  if (need_nul && nul == bytes.end()) return std::nullopt;
  std::string_view text(reinterpret_cast<const char*>(bytes.data()),
                        static_cast<std::size_t>(nul - bytes.begin()));
  if (text.empty() || !looks_like_text(text)) return std::nullopt;
  return text;
}

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

bool is_identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$';
}

// Whether the directive `word` starts at `at` as a whole token (".global" but not ".globalx";
// ".global.u32" counts, conservatively).
bool directive_at(std::string_view text, std::size_t at, std::string_view word) {
  if (!text.substr(at).starts_with(word)) return false;
  std::size_t after = at + word.size();
  return after == text.size() || !is_identifier_char(text[after]);
}

// Linkage directives that may precede a module-scope declaration; the length to skip, or 0.
std::size_t linkage_directive_at(std::string_view text, std::size_t at) {
  for (std::string_view word : {".visible", ".extern", ".weak", ".common"}) {
    if (directive_at(text, at, word)) return word.size();
  }
  return 0;
}

// Module-scope variable declarations: .global (including __managed__, which nvcc writes as
// ".global .attribute(.managed)"), .const (__constant__) and the legacy .tex references.
bool declares_state_at(std::string_view text, std::size_t at) {
  return directive_at(text, at, ".global") || directive_at(text, at, ".const") ||
         directive_at(text, at, ".tex");
}

// The closing quote of the string literal opening at `open`, or npos when the line or the
// text ends first (a backslash never carries a string onto the next line).
std::size_t string_end(std::string_view text, std::size_t open) {
  for (std::size_t j = open + 1; j < text.size() && text[j] != '\n'; ++j) {
    if (text[j] == '"') return j;
    if (text[j] == '\\') {
      if (j + 1 >= text.size() || text[j + 1] == '\n') break;
      ++j;
    }
  }
  return std::string_view::npos;
}

// The line starting at `begin`, without leading blanks, for a reason.
std::string quote_line(std::string_view text, std::size_t begin) {
  std::string_view line = text.substr(begin);
  line = line.substr(0, line.find('\n'));
  while (!line.empty() && is_blank(line.front())) line.remove_prefix(1);
  return quote(line);
}

// Where the statement at `at` ends (just past its ';') when it declares one of nvcc's string
// literals, else npos: ".global .align 1 .b8 $str$1[5] = {97, 46, 99, 117};" exactly in that
// shape (is_string_literal_name), with no linkage directive before it.
std::size_t string_literal_declaration_end(std::string_view text, std::size_t at) {
  std::size_t i = at;
  auto blanks = [&] {
    std::size_t start = i;
    while (i < text.size() && (is_blank(text[i]) || text[i] == '\n')) ++i;
    return i > start;
  };
  auto word = [&](std::string_view w) {
    if (!directive_at(text, i, w)) return false;
    i += w.size();
    return true;
  };
  auto number = [&] {
    std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > start;
  };
  if (!word(".global") || !blanks()) return std::string_view::npos;
  if (word(".align") && !(blanks() && number() && blanks())) return std::string_view::npos;
  if (!(word(".b8") || word(".u8") || word(".s8")) || !blanks()) return std::string_view::npos;
  std::size_t name_begin = i;
  while (i < text.size() && is_identifier_char(text[i])) ++i;
  if (!is_string_literal_name(text.substr(name_begin, i - name_begin))) {
    return std::string_view::npos;
  }
  if (i >= text.size() || text[i++] != '[' || !number() || i >= text.size() || text[i++] != ']') {
    return std::string_view::npos;
  }
  blanks();
  if (i < text.size() && text[i] == '=') {
    ++i;
    blanks();
    if (i >= text.size() || text[i++] != '{') return std::string_view::npos;
    while (i < text.size() && text[i] != '}') {
      if (!(number() || blanks() || text[i] == ',')) return std::string_view::npos;
      if (i < text.size() && text[i] == ',') ++i;
    }
    if (i >= text.size()) return std::string_view::npos;
    ++i;  // '}'
    blanks();
  }
  if (i >= text.size() || text[i] != ';') return std::string_view::npos;
  return i + 1;
}

// Looks for a state-space directive at the start of a statement or a line (so it covers the
// line rule and declarations sharing a line). Comments count as blanks and string literals
// are skipped, so neither can hide a declaration or fake one. Instructions such as
// "ld.global.f32" or "cvta.to.global.u64" start with their opcode and never match.
GlobalsScan scan_ptx(std::string_view text) {
  bool at_start = true;
  bool linked = false;  // a linkage directive began this statement
  std::size_t line = 1;
  std::size_t line_begin = 0;
  std::size_t i = 0;
  auto new_line = [&](std::size_t newline_at) {
    ++line;
    line_begin = newline_at + 1;
    at_start = true;
  };
  while (i < text.size()) {
    char c = text[i];
    std::string_view rest = text.substr(i);
    if (c == '\n') {
      new_line(i++);
    } else if (is_blank(c)) {
      ++i;
    } else if (rest.starts_with("//")) {
      i = std::min(text.find('\n', i), text.size());
    } else if (rest.starts_with("/*")) {
      std::size_t end = text.find("*/", i + 2);
      if (end == std::string_view::npos) return refuse("PTX comment not terminated");
      for (std::size_t j = i; j < end; ++j) {
        if (text[j] == '\n') new_line(j);
      }
      i = end + 2;
    } else if (c == '"') {
      std::size_t end = string_end(text, i);
      if (end == std::string_view::npos) return refuse("PTX string not terminated");
      i = end + 1;
      at_start = false;
    } else if (c == ';' || c == '{' || c == '}') {
      at_start = true;
      linked = false;
      ++i;
    } else if (!at_start) {
      ++i;
    } else if (std::size_t skip = linkage_directive_at(text, i); skip != 0) {
      i += skip;  // still at the start: the state space follows
      linked = true;
    } else if (std::size_t end =
                   linked ? std::string_view::npos : string_literal_declaration_end(text, i);
               end != std::string_view::npos) {
      i = end;  // an assert's or printf's string: nothing a session could change
      at_start = true;
    } else if (declares_state_at(text, i)) {
      return refuse("PTX line " + std::to_string(line) + ": " + quote_line(text, line_begin));
    } else {
      at_start = false;
      ++i;
    }
  }
  return shareable();
}

// ---- Fat-binary containers -------------------------------------------------------------------

struct EntryHeader {
  std::uint16_t kind = 0;
  std::uint32_t header_size = 0;
  std::uint64_t payload_size = 0;
  std::uint32_t compressed_size = 0;
  std::uint32_t arch = 0;
  std::uint64_t flags = 0;
  std::uint64_t uncompressed_size = 0;
};

bool read_entry_header(Bytes entry, EntryHeader& header) {
  return read_at(entry, 0, header.kind) && read_at(entry, 4, header.header_size) &&
         read_at(entry, 8, header.payload_size) && read_at(entry, 16, header.compressed_size) &&
         read_at(entry, 28, header.arch) && read_at(entry, 40, header.flags) &&
         read_at(entry, 56, header.uncompressed_size);
}

std::string entry_label(std::size_t index, const EntryHeader& header) {
  std::string kind = header.kind == kKindPtx   ? "PTX"
                     : header.kind == kKindElf ? "ELF"
                                               : "kind " + std::to_string(header.kind);
  return "entry " + std::to_string(index) + " (" + kind + ", sm_" + std::to_string(header.arch) +
         ")";
}

std::string decompress_lz4(Bytes source, std::vector<std::byte>& out) {
  if (source.size() > INT_MAX) return "LZ4 payload too large";
  int produced = LZ4_decompress_safe(reinterpret_cast<const char*>(source.data()),
                                     reinterpret_cast<char*>(out.data()),
                                     static_cast<int>(source.size()), static_cast<int>(out.size()));
  if (produced < 0 || static_cast<std::size_t>(produced) != out.size()) {
    return "LZ4 payload does not decompress to " + std::to_string(out.size()) + " bytes";
  }
  return {};
}

std::string decompress_zstd(Bytes source, std::vector<std::byte>& out) {
  std::size_t produced = ZSTD_decompress(out.data(), out.size(), source.data(), source.size());
  if (ZSTD_isError(produced) || produced != out.size()) {
    return "ZSTD payload does not decompress to " + std::to_string(out.size()) + " bytes";
  }
  return {};
}

// The payload as the driver will see it, decompressed into `storage` when the entry says it
// is compressed. Empty when `payload` is set, else why not.
std::string entry_payload(Bytes area, const EntryHeader& header, std::vector<std::byte>& storage,
                          Bytes& payload) {
  if (header.flags & kFlagOldCompression) return "old compression scheme";
  bool lz4 = (header.flags & kFlagLz4) != 0;
  bool zstd = (header.flags & kFlagZstd) != 0;
  if (lz4 && zstd) return "both LZ4 and ZSTD flags";
  if (!lz4 && !zstd) {
    payload = area;
    return {};
  }
  if (header.compressed_size > area.size()) return "compressed size beyond the payload";
  if (header.uncompressed_size == 0) return "compressed payload without a size";
  if (header.uncompressed_size > kMaxUncompressedBytes ||
      header.uncompressed_size > kMaxCompressionRatio * header.compressed_size) {
    return "decompression bomb refused (" + std::to_string(header.uncompressed_size) +
           " bytes from " + std::to_string(header.compressed_size) + ")";
  }
  storage.resize(header.uncompressed_size);
  Bytes source = area.first(header.compressed_size);
  std::string problem = lz4 ? decompress_lz4(source, storage) : decompress_zstd(source, storage);
  if (problem.empty()) payload = storage;
  return problem;
}

GlobalsScan scan_payload(std::uint16_t kind, Bytes payload) {
  if (kind == kKindPtx) {
    auto text = ptx_text(payload, /*need_nul=*/false);
    return text ? scan_ptx(*text) : refuse("payload is not PTX text");
  }
  std::uint32_t magic = 0;
  if (!read_at(payload, 0, magic) || magic != kElfMagic) return refuse("payload is not ELF");
  return scan_elf(payload);
}

// One entry, which lies at the start of `entry`; `size` gets its length within the container.
GlobalsScan scan_entry(Bytes entry, std::size_t index, DeviceArch device, std::uint64_t& size) {
  EntryHeader header;
  if (!read_entry_header(entry, header)) {
    return refuse("entry " + std::to_string(index) + " header cut short");
  }
  std::string label = entry_label(index, header) + ": ";
  if (header.header_size < kEntryBaseBytes ||
      !fits(entry, header.header_size, header.payload_size)) {
    return refuse(label + "runs past its container");
  }
  if (header.kind != kKindPtx && header.kind != kKindElf) return refuse(label + "unknown kind");
  size = std::uint64_t{header.header_size} + header.payload_size;
  if (!device.may_load(header.kind, header.arch)) return shareable();
  std::vector<std::byte> storage;
  Bytes payload;
  std::string problem = entry_payload(entry.subspan(header.header_size, header.payload_size),
                                      header, storage, payload);
  if (!problem.empty()) return refuse(label + problem);
  return located(label, scan_payload(header.kind, payload));
}

// One container, which starts `bytes` (and may be followed by more); `size` gets its length.
GlobalsScan scan_container(Bytes bytes, DeviceArch device, std::uint64_t& size) {
  std::uint32_t magic = 0;
  std::uint16_t version = 0, header_size = 0;
  std::uint64_t fat_size = 0;
  if (!read_at(bytes, 0, magic) || !read_at(bytes, 4, version) || !read_at(bytes, 6, header_size) ||
      !read_at(bytes, 8, fat_size)) {
    return refuse("container header cut short");
  }
  if (magic != kFatbinMagic) return refuse("not a fat-binary container");
  if (version != kFatbinVersion) return refuse("container version " + std::to_string(version));
  if (header_size != kFatbinHeaderBytes) {
    return refuse("container header size " + std::to_string(header_size));
  }
  if (!fits(bytes, header_size, fat_size)) return refuse("container cut short");
  if (fat_size == 0) return refuse("container without entries");
  size = header_size + fat_size;
  Bytes entries = bytes.subspan(header_size, fat_size);
  std::uint64_t at = 0;
  for (std::size_t index = 0; at < entries.size(); ++index) {
    std::uint64_t entry_size = 0;
    GlobalsScan scan = scan_entry(entries.subspan(at), index, device, entry_size);
    if (!scan.shareable) return scan;
    at += entry_size;  // >= kEntryBaseBytes and within `entries`: the loop ends
  }
  return shareable();
}

GlobalsScan scan_containers(Bytes image, std::uint32_t count, DeviceArch device) {
  std::uint64_t at = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint64_t size = 0;
    std::string where = count > 1 ? "container " + std::to_string(i) + ", " : "";
    GlobalsScan scan = located(where, scan_container(image.subspan(at), device, size));
    if (!scan.shareable) return scan;
    at += size;
  }
  // Several containers are one device-linked program and must be exactly the bytes sent; a
  // single one is read by its own length, so what follows it is never loaded.
  if (count > 1 && at != image.size()) {
    return refuse(std::to_string(image.size() - at) + " bytes after container " +
                  std::to_string(count - 1));
  }
  return shareable();
}

GlobalsScan scan_image(Bytes image, std::uint32_t containers, DeviceArch device) {
  if (containers == 0) return refuse("no containers");
  std::uint32_t magic = 0;
  bool has_magic = read_at(image, 0, magic);
  if (has_magic && magic == kFatbinMagic) return scan_containers(image, containers, device);
  if (containers != 1) {
    return refuse(std::to_string(containers) + " containers expected, image is not a fat binary");
  }
  if (has_magic && magic == kFatbinWrapperMagic) return refuse("fat-binary wrapper, not an image");
  if (has_magic && magic == kElfMagic) return located("ELF image: ", scan_elf(image));
  auto text = ptx_text(image, /*need_nul=*/true);
  if (!text) return refuse("neither a fat binary, an ELF nor NUL-terminated PTX text");
  return located("PTX image: ", scan_ptx(*text));
}

}  // namespace

bool is_string_literal_name(std::string_view name) {
  auto digits = [](std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (name == "$str") return true;
  if (name.starts_with("$str$")) return digits(name.substr(5));
  if (name.starts_with("__unnamed_")) return digits(name.substr(10));
  return false;
}

bool DeviceArch::may_load(std::uint16_t kind, std::uint32_t arch) const {
  if (major <= 0) return true;
  const std::uint32_t own =
      10u * static_cast<std::uint32_t>(major) + static_cast<std::uint32_t>(minor);
  if (kind == kKindPtx) return arch <= own;
  if (kind == kKindElf) return arch / 10 == static_cast<std::uint32_t>(major) && arch <= own;
  return true;  // an unknown kind is refused by the caller
}

GlobalsScan scan_image_globals(std::span<const std::byte> image, std::uint32_t containers,
                               DeviceArch device) noexcept {
  try {
    return scan_image(image, containers, device);
  } catch (const std::bad_alloc&) {
    return GlobalsScan{false, "out of memory"};  // short enough not to allocate
  } catch (...) {
    return GlobalsScan{false, "scan failed"};
  }
}

}  // namespace mpsshim::server
