// The memory limit of this process (hils/memory.hpp).
#include "hils/memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

namespace hils {

namespace {

// The first word of a cgroup file as a byte count; 0 when absent, "max" or not a number.
double cgroup_bytes(const char* file) {
  std::ifstream in(file);
  std::string value;
  if (!(in >> value) || value == "max") return 0;
  try {
    return std::stod(value);
  } catch (const std::exception&) {
    return 0;
  }
}

// The limit of the cgroup this process is in, or 0 for none. v1 writes "no limit" as a number
// near 2^63, which is above any machine's memory and so never chosen.
double cgroup_limit() {
  const double v2 = cgroup_bytes("/sys/fs/cgroup/memory.max");
  return v2 > 0 ? v2 : cgroup_bytes("/sys/fs/cgroup/memory/memory.limit_in_bytes");
}

int g_sharing = 1;  // set_processes_sharing_memory
// set_units_at_once; atomic: units on several threads read it (through memory_limit()).
std::atomic<int> g_units_at_once{1};
thread_local int t_sequences = 1;  // SequencesAtOnce

}  // namespace

void set_processes_sharing_memory(int processes) { g_sharing = processes > 1 ? processes : 1; }

void set_units_at_once(int units) { g_units_at_once.store(units > 1 ? units : 1); }

SequencesAtOnce::SequencesAtOnce(int sequences) : previous_(t_sequences) {
  t_sequences = sequences > 1 ? sequences : 1;
}

SequencesAtOnce::~SequencesAtOnce() { t_sequences = previous_; }

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  for (; unit < 4 && bytes >= 1024; ++unit) bytes /= 1024;
  char text[48];
  std::snprintf(text, sizeof text, "%.3g %s", bytes, units[unit]);
  return text;
}

MemoryLimit memory_limit() {
  MemoryLimit limit;
  limit.bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  limit.text = "this machine's " + bytes_text(limit.bytes) + " of memory";
  const double cgroup = cgroup_limit();
  if (cgroup > 0 && cgroup < limit.bytes) {
    limit.bytes = cgroup;
    limit.text = "this process's cgroup limit of " + bytes_text(cgroup);
  }
  if (g_sharing > 1) {
    limit.bytes /= g_sharing;
    limit.text += " shared by " + std::to_string(g_sharing) + " processes of this job (" +
                  bytes_text(limit.bytes) + " each)";
  }
  if (const int units = g_units_at_once.load(); units > 1) {
    limit.bytes /= units;
    limit.text += " shared by " + std::to_string(units) + " units computed at once (--jobs " +
                  std::to_string(units) + "; " + bytes_text(limit.bytes) + " each)";
  }
  rlimit address{};
  const double units = static_cast<double>(g_units_at_once.load());
  if (getrlimit(RLIMIT_AS, &address) == 0 && address.rlim_cur != RLIM_INFINITY &&
      static_cast<double>(address.rlim_cur) / units < limit.bytes) {
    limit.bytes = static_cast<double>(address.rlim_cur) / units;
    limit.text = "the address-space limit (ulimit -v) of " +
                 bytes_text(static_cast<double>(address.rlim_cur));
    if (units > 1)
      limit.text += " shared by " + std::to_string(g_units_at_once.load()) +
                    " units computed at once (--jobs; " + bytes_text(limit.bytes) + " each)";
  }
  if (t_sequences > 1) {
    limit.bytes /= t_sequences;
    limit.text += " shared by the " + std::to_string(t_sequences) +
                  " sequences of a batch held at once (" + bytes_text(limit.bytes) + " each)";
  }
  return limit;
}

}  // namespace hils
