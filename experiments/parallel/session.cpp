#include "parallel/session.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "hils/memory.hpp"
#include "parallel/mpi_runner.hpp"

#ifdef HILS_WITH_MPI
#include <mpi.h>
#endif

namespace hils::parallel {

namespace {

Session* g_session = nullptr;
std::unique_ptr<analysis::ThreadedUnitRunner> g_threaded;  // use_jobs(> 1)

// Set by mpirun (OpenMPI), srun/PMIx and MPICH's hydra: only then is MPI initialized, so that
// a plain `hils ...` never touches the MPI runtime.
bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(name)) return true;
  return false;
}

}  // namespace

bool built_with_mpi() {
#ifdef HILS_WITH_MPI
  return true;
#else
  return false;
#endif
}

Session::Session(int& argc, char**& argv) {
#ifdef HILS_WITH_MPI
  if (launched_by_mpi()) {
    MPI_Init(&argc, &argv);
    mpi_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The ranks on this node share its memory: each size check counts its share only.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int on_node = 1;
    MPI_Comm_size(node, &on_node);
    MPI_Comm_free(&node);
    set_processes_sharing_memory(on_node);
    if (size_ > 1) runner_ = std::make_unique<MpiUnitRunner>(rank_, size_);
  }
#else
  (void)argc, (void)argv;
#endif
  g_session = this;
}

Session::~Session() {
  g_session = nullptr;
#ifdef HILS_WITH_MPI
  if (!mpi_) return;
  // Every rank ends through the same handshake, failed or not (no MPI_Abort: mpi_runner.hpp).
  if (runner_) runner_->end_job(exit_status_, message_);
  MPI_Finalize();
#endif
}

analysis::UnitRunner& Session::runner() {
  if (runner_) return *runner_;
  return analysis::serial_runner();
}

Session* Session::current() { return g_session; }

analysis::UnitRunner& current_runner() {
  if (ranks() > 1) return g_session->runner();
  if (g_threaded) return *g_threaded;
  return analysis::serial_runner();
}

int default_jobs() { return std::max(1, omp_get_max_threads()); }

int use_jobs(std::optional<int64_t> jobs) {
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  if (jobs && (*jobs < 1 || *jobs > 4 * hardware))
    throw InvalidArgument("--jobs: expected an integer from 1 to " + std::to_string(4 * hardware) +
                          " (units computed at once; at most 4 per hardware thread of this "
                          "machine), got " + std::to_string(*jobs));
  if (jobs && *jobs > 1 && ranks() > 1)
    throw InvalidArgument("--jobs: expected 1 under mpirun with " + std::to_string(ranks()) +
                          " ranks (each rank computes one unit at a time: start more ranks "
                          "instead), got " + std::to_string(*jobs));
  const int chosen = static_cast<int>(jobs ? *jobs : ranks() > 1 ? 1 : default_jobs());
  g_threaded.reset();
  if (chosen > 1)
    g_threaded = std::make_unique<analysis::ThreadedUnitRunner>(chosen, omp_get_max_threads());
  set_units_at_once(chosen);
  return chosen;
}

bool holds_results() { return !g_session || g_session->holds_results(); }

int ranks() { return g_session ? g_session->size() : 1; }

}  // namespace hils::parallel
