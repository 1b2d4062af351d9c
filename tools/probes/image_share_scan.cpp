// Which fat-binary containers of real libraries would the server share between sessions
// (broker/server/images/image_globals.hpp), and why not the others? Reads the .nv_fatbin section of
// each ELF file given, scans every container as the server does, and prints per file the
// containers and bytes shareable and the scan's time, then the most common reasons for the rest
// (their first words, with the variable or section named). `--arch 90` first scans as a server
// of a compute capability 9.0 GPU does (only the entries it may load); without it, every entry.
//
// Build here (it links the server's scanner), run anywhere the libraries are:
//   src=tools/probes/image_share_scan.cpp; scanner=broker/server/images/image_globals.cpp
//   g++ -O2 -std=c++20 -I. -o /tmp/iss $src $scanner -lzstd -llz4
//   /tmp/iss [--arch 90] /path/to/libtorch_cuda.so ...
#include <elf.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "broker/server/images/image_globals.hpp"

namespace {

std::vector<std::span<const std::byte>> containers_of(const std::vector<std::byte>& elf) {
  std::vector<std::span<const std::byte>> out;
  if (elf.size() < sizeof(Elf64_Ehdr)) return out;
  Elf64_Ehdr eh;
  std::memcpy(&eh, elf.data(), sizeof eh);
  if (eh.e_shoff + std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) > elf.size()) return out;
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  std::memcpy(sh.data(), elf.data() + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
  const char* names = reinterpret_cast<const char*>(elf.data()) + sh[eh.e_shstrndx].sh_offset;
  for (const Elf64_Shdr& s : sh) {
    if (std::strcmp(names + s.sh_name, ".nv_fatbin") != 0 &&
        std::strcmp(names + s.sh_name, ".nv.fatbin") != 0)
      continue;
    std::size_t at = s.sh_offset;
    const std::size_t end = s.sh_offset + s.sh_size;
    while (at + 16 <= end) {
      std::uint32_t magic;
      std::memcpy(&magic, elf.data() + at, 4);
      if (magic != 0xBA55ED50u) {
        at += 8;  // alignment between containers
        continue;
      }
      std::uint16_t header;
      std::uint64_t size;
      std::memcpy(&header, elf.data() + at + 6, 2);
      std::memcpy(&size, elf.data() + at + 8, 8);
      if (at + header + size > end) break;
      out.emplace_back(elf.data() + at, header + size);
      at += header + size;
    }
  }
  return out;
}

// "entry 3 (ELF, sm_90): variable _ZN2at6native... in section .nv.global.init" -> the part after
// the location, cut to 60 characters: reasons group by what they name.
std::string reason_key(const std::string& reason) {
  std::size_t colon = reason.find("): ");
  std::string key = colon == std::string::npos ? reason : reason.substr(colon + 3);
  if (key.rfind("PTX line ", 0) == 0) key = "PTX declaration";
  return key.substr(0, 60);
}

}  // namespace

int main(int argc, char** argv) {
  mpsshim::server::DeviceArch device;
  int first = 1;
  if (argc > 2 && std::strcmp(argv[1], "--arch") == 0) {
    const int arch = std::atoi(argv[2]);
    if (arch < 10) {
      std::fprintf(stderr, "--arch takes 10 * major + minor, e.g. 90 for compute capability 9.0\n");
      return 2;
    }
    device = {arch / 10, arch % 10};
    first = 3;
  }
  for (int i = first; i < argc; ++i) {
    std::ifstream file(argv[i], std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    std::vector<std::byte> elf(raw.size());
    std::memcpy(elf.data(), raw.data(), raw.size());
    const auto containers = containers_of(elf);
    std::size_t shared = 0, shared_bytes = 0, total_bytes = 0;
    std::map<std::string, int> reasons;
    const auto start = std::chrono::steady_clock::now();
    for (auto container : containers) {
      total_bytes += container.size();
      auto scan = mpsshim::server::scan_image_globals(container, 1, device);
      if (scan.shareable) {
        ++shared;
        shared_bytes += container.size();
      } else {
        ++reasons[reason_key(scan.reason)];
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %zu containers (%.1f MiB), %zu shareable (%.1f MiB), scanned in %.3f s\n",
                argv[i], containers.size(), total_bytes / 1048576.0, shared,
                shared_bytes / 1048576.0, seconds);
    std::vector<std::pair<int, std::string>> sorted;
    for (auto& [reason, count] : reasons) sorted.push_back({count, reason});
    std::sort(sorted.rbegin(), sorted.rend());
    for (std::size_t k = 0; k < sorted.size() && k < 12; ++k) {
      std::printf("  %6d  %s\n", sorted[k].first, sorted[k].second.c_str());
    }
  }
  return 0;
}
