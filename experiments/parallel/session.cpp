#include "parallel/session.hpp"

#include <omp.h>

#include <algorithm>
#include <cctype>
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

// Whether OMP_NUM_THREADS sets the threads: a positive number first (OpenMP reads "8" or
// "8,2", its first level, and ignores "", "0" or "four" with a warning, using every core as if
// it were unset; counting those as set gave each worker rank the node's cores, not its share).
bool omp_num_threads_given() {
  const char* value = std::getenv("OMP_NUM_THREADS");
  if (!value) return false;
  const std::string text(value);
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return false;
  size_t end = begin;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  const std::string rest = text.substr(end);
  const size_t after = rest.find_first_not_of(" \t");
  const bool digits_then_end_or_list = after == std::string::npos || rest[after] == ',';
  return end > begin && digits_then_end_or_list &&
         text.substr(begin, end - begin).find_first_not_of('0') != std::string::npos;
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
    // A worker's unit threads (--jobs) never call MPI; its main thread does (mpi_runner.hpp).
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    mpi_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    funneled_ = provided >= MPI_THREAD_FUNNELED;
    // The ranks on this node share its memory: each size check counts its share only.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int on_node = 1;
    MPI_Comm_size(node, &on_node);
    int first_on_node = rank_;  // rank 0, the coordinator, is the first rank of its node
    MPI_Bcast(&first_on_node, 1, MPI_INT, 0, node);
    MPI_Comm_free(&node);
    set_processes_sharing_memory(on_node);
    computing_on_node_ = std::max(1, on_node - (first_on_node == 0 ? 1 : 0));
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

void Session::set_jobs(int jobs, int threads) {
  if (runner_) runner_->set_jobs(jobs, threads);
}

analysis::UnitRunner& current_runner() {
  if (ranks() > 1) return g_session->runner();
  if (g_threaded) return *g_threaded;
  return analysis::serial_runner();
}

int default_jobs() { return rank_threads(); }

int rank_threads() {
  const int threads = std::max(1, omp_get_max_threads());
  if (ranks() == 1 || omp_num_threads_given()) return threads;
  // Unset, OpenMP counts the cores this rank may run on: all of the node's when mpirun binds
  // it to none (its share is theirs divided among the node's computing ranks), else those it
  // is bound to (its share already).
  const int node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads < node) return threads;
  return std::max(1, threads / g_session->computing_on_node());
}

int use_jobs(std::optional<int64_t> jobs) {
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  if (jobs && (*jobs < 1 || *jobs > 4 * hardware))
    throw InvalidArgument("--jobs: expected an integer from 1 to " + std::to_string(4 * hardware) +
                          " (units computed at once; at most 4 per hardware thread of this "
                          "machine), got " + std::to_string(*jobs));
  const int threads = rank_threads();
  const int chosen = static_cast<int>(jobs ? *jobs : threads);
  g_threaded.reset();
  if (ranks() > 1) {
    if (chosen > 1 && !g_session->funneled())
      throw InvalidArgument("--jobs: expected 1 with this MPI library, which does not allow "
                            "threads beside the one calling MPI (MPI_THREAD_FUNNELED), got " +
                            std::to_string(chosen));
    omp_set_num_threads(threads);  // one unit at a time on a rank: its share of the cores
    g_session->set_jobs(chosen, threads);
  } else if (chosen > 1) {
    g_threaded = std::make_unique<analysis::ThreadedUnitRunner>(chosen, threads);
  }
  set_units_at_once(chosen);
  return chosen;
}

bool holds_results() { return !g_session || g_session->holds_results(); }

int ranks() { return g_session ? g_session->size() : 1; }

}  // namespace hils::parallel
