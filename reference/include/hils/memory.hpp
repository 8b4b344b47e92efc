// How much memory this process may use, for the checks that refuse a size before anything is
// allocated (a size beyond it ends in an out-of-memory kill, not a message): the reference's
// outputs check (run_mechanism) and the `hils` tool's checks of its inputs and units.
#pragma once

#include <string>

namespace hils {

struct MemoryLimit {
  double bytes = 0;
  std::string text;  // what sets it: "this machine's 23.5 GiB of memory", "the cgroup limit ..."
};

// The least of: the machine's physical memory or the memory limit of this process's cgroup (v2
// memory.max, v1 memory.limit_in_bytes), divided among the processes sharing it, and its
// address-space limit (ulimit -v). On a cluster node a job's cgroup, not the node's memory, is
// what the kernel enforces.
MemoryLimit memory_limit();

// The processes of one job that share this machine's memory (the MPI ranks on this node, set
// once at start-up by the `hils` tool; 1 otherwise): memory_limit() gives each its share of the
// machine's or cgroup's memory, since each may hold a unit of that size at once.
void set_processes_sharing_memory(int processes);

// The units one process computes at once (the `hils` tool's --jobs, set before a run; 1
// otherwise): memory_limit() gives each unit its share of the process's, since each holds its
// inputs and outputs at once.
void set_units_at_once(int units);

// The sequences of a batch held at once by this thread's caller (hils.verify and hils.reference
// with a batched layout keep one oracle or reference per sequence): while one lives,
// memory_limit() on this thread gives each sequence its share, so that the checks refuse a batch
// that does not fit as they refuse one sequence, before anything is allocated. Thread-local: the
// checks of one call run on its thread (run_mechanism's before its parallel loops).
class SequencesAtOnce {
 public:
  explicit SequencesAtOnce(int sequences);
  ~SequencesAtOnce();
  SequencesAtOnce(const SequencesAtOnce&) = delete;
  SequencesAtOnce& operator=(const SequencesAtOnce&) = delete;

 private:
  int previous_;
};

// A byte count for messages: "512 bytes", "3.5 KiB", "12.3 GiB", "1.49e+04 TiB".
std::string bytes_text(double bytes);

}  // namespace hils
