#include "traced_tables.hpp"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "memory_peek.hpp"
#include "slot_wrappers.hpp"
#include "trace_log.hpp"

namespace darktrace {
namespace {

// The runtime's own tables: cudart hashes their addresses in its integrity check
// (docs/private-tables.md), so a copy makes it fail with error 103. "all" leaves them alone.
constexpr const char* kIntegrityChecked[] = {"6bd5fb6c", "d4082055"};

// A size word is n_slots * 8; a table without one (CONTEXT_LOCAL_STORAGE) starts with a
// function pointer, far above any plausible size.
constexpr std::uint64_t kMaxSizeWord = 64 * 1024;

constexpr std::size_t kPeekBytes = 64;

struct TracedTable {
  std::string uuid;
  std::vector<std::uint64_t> copy;  // what callers get
  std::vector<std::uint64_t> real;  // the driver's words, for the wrappers to call
};

// Never destroyed: libraries call table slots from their own exit handlers, after this
// library's static destructors would have run.
std::mutex registry_mutex;
TracedTable* const traced = new TracedTable[kMaxTables];
std::size_t traced_count = 0;

struct Seen {
  std::string uuid;
  const void* real;
  const void* given;
};
std::vector<Seen>& seen = *new std::vector<Seen>;  // every table asked, and what was given

std::string uuid_hex(const unsigned char* uuid) {
  return hex(uuid, 16).erase(16, 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool integrity_checked(const std::string& uuid) {
  for (const char* prefix : kIntegrityChecked) {
    if (uuid.starts_with(prefix)) return true;
  }
  return false;
}

// DARKTRACE_TABLES: comma-separated UUID hex prefixes, or "all" (but the integrity-checked).
bool selected(const std::string& uuid) {
  const char* env = std::getenv("DARKTRACE_TABLES");
  if (env == nullptr) return false;
  const std::string list = lower(env);
  std::size_t begin = 0;
  while (begin <= list.size()) {
    std::size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(begin, end - begin);
    if (item == "all" && !integrity_checked(uuid)) return true;
    if (!item.empty() && item != "all" && uuid.starts_with(item)) return true;
    begin = end + 1;
  }
  return false;
}

// The words of the table at `real`: size word first when it has one, else (headerless) the
// leading code pointers up to the first word that is not one.
std::vector<std::uint64_t> read_table(const std::uint64_t* real, bool& sized) {
  const std::uint64_t size_word = real[0];
  sized = size_word >= 8 && size_word <= kMaxSizeWord && size_word % 8 == 0;
  if (sized) return {real, real + size_word / 8};
  std::vector<std::uint64_t> words;
  while (words.size() < kMaxSlots && real[words.size()] != 0 &&
         is_code(std::uintptr_t(real[words.size()]))) {
    words.push_back(real[words.size()]);
  }
  words.push_back(0);  // the terminating NULL, kept in the copy
  return words;
}

void log_census(const std::string& uuid, const std::vector<std::uint64_t>& words, bool sized,
                const void* real) {
  write_line(format("table uuid=%s real=%p layout=%s size=%llu slots=%zu", uuid.c_str(), real,
                    sized ? "sized" : "headerless", sized ? (unsigned long long)words[0] : 0ULL,
                    words.size()));
  for (std::size_t i = sized ? 1 : 0; i < words.size(); ++i) {
    const void* fn = reinterpret_cast<const void*>(words[i]);
    const char* kind = words[i] == 0 ? "null" : is_code(words[i]) ? "code" : "data";
    write_line(format("slot uuid=%.8s index=%zu ptr=%p kind=%s where=%s", uuid.c_str(), i, fn, kind,
                      words[i] == 0 ? "-" : where(fn, true).c_str()));
  }
}

// A traced copy of `words`: code slots below kMaxSlots become wrappers; the size word, NULL
// and data slots stay as they are. Returns the copy's address, or nullptr when every traced
// table's place is taken.
const void* make_traced(const std::string& uuid, const std::vector<std::uint64_t>& words,
                        bool sized) {
  if (traced_count == kMaxTables) {
    write_line(
        format("traced uuid=%.8s no: all %zu traced tables taken", uuid.c_str(), kMaxTables));
    return nullptr;
  }
  const std::size_t index = traced_count++;
  TracedTable& table = traced[index];
  table.uuid = uuid;
  table.real = words;
  table.copy = words;
  std::size_t wrapped = 0;
  for (std::size_t i = sized ? 1 : 0; i < words.size(); ++i) {
    if (words[i] == 0 || !is_code(words[i])) continue;
    if (i >= kMaxSlots) {
      write_line(format("traced uuid=%.8s slot=%zu not wrapped: past %zu slots", uuid.c_str(), i,
                        kMaxSlots));
      continue;
    }
    table.copy[i] = reinterpret_cast<std::uint64_t>(kSlotWrappers[index][i]);
    ++wrapped;
  }
  write_line(format("traced uuid=%.8s copy=%p wrapped=%zu", uuid.c_str(),
                    static_cast<const void*>(table.copy.data()), wrapped));
  if (integrity_checked(uuid)) {
    write_line(format("warning uuid=%.8s is hashed by cudart's integrity check: expect error 103",
                      uuid.c_str()));
  }
  return table.copy.data();
}

// Up to 64 bytes at each argument that is a readable pointer.
void log_pointees(std::uint64_t tid, std::uint64_t seq, const char* when,
                  const std::array<std::uint64_t, 8>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (!looks_like_pointer(args[i])) continue;
    unsigned char bytes[kPeekBytes];
    const std::size_t n = peek(std::uintptr_t(args[i]), bytes, sizeof bytes);
    if (n == 0) continue;  // not readable: a handle, a device address, a freed page
    write_line(format("mem tid=%llu seq=%llu when=%s arg=%zu addr=0x%llx n=%zu hex=%s",
                      (unsigned long long)tid, (unsigned long long)seq, when, i,
                      (unsigned long long)args[i], n, hex(bytes, n).c_str()));
  }
}

}  // namespace

const void* table_for_caller(const unsigned char* uuid_bytes, const void* real, int result,
                             const void* caller) {
  const std::string uuid = uuid_hex(uuid_bytes);
  std::lock_guard lock(registry_mutex);
  const void* given = real;
  const Seen* before = nullptr;
  for (const Seen& s : seen) {
    if (s.uuid == uuid && s.real == real) before = &s;
  }
  if (before != nullptr) {
    given = before->given;  // the same address on every call
  } else if (real != nullptr) {
    bool sized = false;
    const auto words = read_table(static_cast<const std::uint64_t*>(real), sized);
    log_census(uuid, words, sized, real);
    if (selected(uuid)) {
      if (const void* copy = make_traced(uuid, words, sized)) given = copy;
    }
    seen.push_back({uuid, real, given});
  }
  write_line(format("ask uuid=%s result=%d real=%p given=%p caller=%s", uuid.c_str(), result, real,
                    given, where(caller, false).c_str()));
  return given;
}

std::uint64_t traced_call(std::size_t table_index, std::size_t slot, const void* caller,
                          const std::array<std::uint64_t, 8>& args) {
  thread_local std::uint64_t sequence = 0;
  const std::uint64_t seq = ++sequence;
  const std::uint64_t tid = thread_id();
  const TracedTable& table = traced[table_index];  // complete before its copy was handed out
  const auto real = reinterpret_cast<SlotFn>(table.real[slot]);
  write_line(format(
      "call tid=%llu seq=%llu uuid=%.8s slot=%zu caller=%s args=0x%llx,0x%llx,"
      "0x%llx,0x%llx,0x%llx,0x%llx,0x%llx,0x%llx",
      (unsigned long long)tid, (unsigned long long)seq, table.uuid.c_str(), slot,
      where(caller, false).c_str(), (unsigned long long)args[0], (unsigned long long)args[1],
      (unsigned long long)args[2], (unsigned long long)args[3], (unsigned long long)args[4],
      (unsigned long long)args[5], (unsigned long long)args[6], (unsigned long long)args[7]));
  log_pointees(tid, seq, "before", args);
  const std::uint64_t result =
      real(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7]);
  write_line(format("ret tid=%llu seq=%llu uuid=%.8s slot=%zu rv=0x%llx", (unsigned long long)tid,
                    (unsigned long long)seq, table.uuid.c_str(), slot, (unsigned long long)result));
  log_pointees(tid, seq, "after", args);
  return result;
}

}  // namespace darktrace
