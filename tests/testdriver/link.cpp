// The JIT linker in the test driver. Any input links, except text holding "syntax error", which is
// refused as the real driver refuses bad PTX (CUDA_ERROR_INVALID_PTX, with the reason in the error
// log); a link without inputs completes, as on an H200 with driver 580. The linked image is a small
// ELF (what cuModuleLoadData and mpsshim's image reader take) whose one section lists the inputs'
// names. Logs and the wall time go where the options say, as the driver writes them.
#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

struct LinkState {
  char* info_log = nullptr;
  std::size_t info_capacity = 0;
  char* error_log = nullptr;
  std::size_t error_capacity = 0;
  void** wall_time = nullptr;  // the CU_JIT_WALL_TIME option's value slot
  std::vector<std::string> inputs;
  std::string info;
  std::vector<std::byte> image;
};

void write_log(char* to, std::size_t capacity, const std::string& text) {
  if (to == nullptr || capacity == 0) return;
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(to, text.data(), n);
  to[n] = '\0';
}

void note_wall_time(LinkState& link) {
  if (link.wall_time == nullptr) return;
  const float ms = 0.25f;  // a fixed, plausible figure: tests check that it arrives
  *link.wall_time = nullptr;
  std::memcpy(link.wall_time, &ms, sizeof ms);
}

CUresult add(LinkState* link, CUjitInputType type, const void* data, std::size_t size,
             std::string_view name) {
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (data == nullptr || size == 0 || type > CU_JIT_INPUT_NVVM) return CUDA_ERROR_INVALID_VALUE;
  const std::string_view bytes(static_cast<const char*>(data), size);
  if (bytes.find("syntax error") != std::string_view::npos) {
    write_log(
        link->error_log, link->error_capacity,
        "ptxas application ptx input, line 1; fatal   : Parser error in " + std::string(name));
    note_wall_time(*link);
    return CUDA_ERROR_INVALID_PTX;
  }
  link->inputs.emplace_back(name);
  link->info += "test driver: added " + std::string(name) + "\n";
  write_log(link->info_log, link->info_capacity, link->info);
  note_wall_time(*link);
  return CUDA_SUCCESS;
}

// An ELF64 header, one PROGBITS section header, then the section: the inputs' names.
std::vector<std::byte> linked_image(const std::vector<std::string>& inputs) {
  std::string body;
  for (const std::string& name : inputs) body += name + '\n';
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_EXEC;
  eh.e_machine = 190;  // EM_CUDA
  eh.e_version = EV_CURRENT;
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_shoff = sizeof(Elf64_Ehdr);
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = 1;
  Elf64_Shdr sh{};
  sh.sh_type = SHT_PROGBITS;
  sh.sh_offset = sizeof(Elf64_Ehdr) + sizeof(Elf64_Shdr);
  sh.sh_size = body.size();
  std::vector<std::byte> image(sizeof eh + sizeof sh + body.size());
  std::memcpy(image.data(), &eh, sizeof eh);
  std::memcpy(image.data() + sizeof eh, &sh, sizeof sh);
  std::memcpy(image.data() + sizeof eh + sizeof sh, body.data(), body.size());
  return image;
}

LinkState* link_of(CUlinkState state) {
  return reinterpret_cast<LinkState*>(state);
}

}  // namespace
}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLinkCreate_v2(unsigned int count,
                                                           CUjit_option* options, void** values,
                                                           CUlinkState* out) {
  return entry([&](State&) {
    if (out == nullptr || (count > 0 && (options == nullptr || values == nullptr))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto link = std::make_unique<LinkState>();
    for (unsigned i = 0; i < count; ++i) {
      switch (options[i]) {
        case CU_JIT_INFO_LOG_BUFFER:
          link->info_log = static_cast<char*>(values[i]);
          break;
        case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
          link->info_capacity = reinterpret_cast<std::uintptr_t>(values[i]);
          break;
        case CU_JIT_ERROR_LOG_BUFFER:
          link->error_log = static_cast<char*>(values[i]);
          break;
        case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
          link->error_capacity = reinterpret_cast<std::uintptr_t>(values[i]);
          break;
        case CU_JIT_WALL_TIME:
          link->wall_time = &values[i];
          break;
        default:
          if (options[i] >= CU_JIT_NUM_OPTIONS) return CUDA_ERROR_INVALID_VALUE;
      }
    }
    *out = reinterpret_cast<CUlinkState>(link.release());
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type,
                                                            void* data, size_t size,
                                                            const char* name, unsigned int,
                                                            CUjit_option*, void**) {
  return entry(
      [&](State&) { return add(link_of(state), type, data, size, name != nullptr ? name : ""); });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLinkAddFile_v2(CUlinkState state, CUjitInputType type,
                                                            const char* path, unsigned int,
                                                            CUjit_option*, void**) {
  return entry([&](State&) {
    if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::ifstream file(path, std::ios::binary);
    if (!file) return CUDA_ERROR_FILE_NOT_FOUND;
    const std::string bytes((std::istreambuf_iterator<char>(file)), {});
    return add(link_of(state), type, bytes.data(), bytes.size(), path);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLinkComplete(CUlinkState state, void** image,
                                                          size_t* bytes) {
  return entry([&](State&) {
    LinkState* link = link_of(state);
    if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (image == nullptr || bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    link->image = linked_image(link->inputs);
    link->info += "test driver: linked " + std::to_string(link->inputs.size()) + " inputs\n";
    write_log(link->info_log, link->info_capacity, link->info);
    note_wall_time(*link);
    *image = link->image.data();
    *bytes = link->image.size();
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLinkDestroy(CUlinkState state) {
  return entry([&](State&) {
    LinkState* link = link_of(state);
    if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    delete link;
    return CUDA_SUCCESS;
  });
}
