// The study commands, one row each: what `hils <command>`, `hils studies`, the study's settings
// and its results file know of a study by name. Its runner (run_studies.cpp, kStudyRunners) and
// its default lengths (study_config.cpp) stand beside it; the tests sweep every row
// (tests/experiments/test_study_table.cpp: a run, --jobs, the config table, the plots, the
// documents). README "Adding a study". Header only, so that the tests read the same rows.
#pragma once

#include <array>
#include <string_view>

namespace hils::cli::studies {

struct StudyRow {
  std::string_view command;      // `hils <command>`
  std::string_view study;        // config.study of its results, its config table [<study>], and
                                 // `hils studies`' file <study>_synthetic.h5
  std::string_view description;  // `hils <command> --help`
  // Empty when its units sample queries and score mechanisms (--queries and --mechanisms apply,
  // fidelity and extrapolation); else why each of the two flags is refused ("hils <command>
  // <why>; --queries is for hils <the commands that sample>").
  std::string_view why_no_queries = {}, why_no_mechanisms = {};
  bool in_model_studies = false;  // `hils studies` runs it on the real model too, when it is there

  constexpr bool samples_queries() const { return why_no_queries.empty(); }
};

inline constexpr std::array kStudies{
    StudyRow{"fidelity", "fidelity",
             "Chunk-mass fidelity: surrogate scores vs the true chunk mass (reference/SEMANTICS.md "
             "§9), per layer, head and length.\nExample: hils fidelity --out fidelity.h5 --plot",
             {}, {}, true},
    StudyRow{"overlap", "overlap",
             "Chunk overlap of adjacent queries' selections (paper §7.2, Fig. 7), per layer, KV "
             "group and length.\nExample: hils overlap --out overlap.h5 --lengths 4096 16384 65536",
             "studies the last [overlap] tail_queries queries of each length (default 256)",
             "studies one mechanism, [overlap] mechanism in a --config (default taylor_entropy)",
             true},
    StudyRow{"extrapolate", "extrapolation",
             "Length extrapolation under RoPE, HoPE and NoPE, and the needle grid.\n"
             "Example (seconds): hils extrapolate --out extrapolation.h5 --lengths 1024 2048 "
             "--n-layers 1 --queries 8\n"
             "The defaults (lengths 1024 to 65536, 2 layers) take ~16 s on 2 cores."},
};

// The row of `study` (config.study's name); nullptr for none.
constexpr const StudyRow* study_row(std::string_view study) {
  for (const auto& row : kStudies)
    if (row.study == study) return &row;
  return nullptr;
}

static_assert([] {
  for (const auto& row : kStudies)
    if (row.command.empty() || row.study.empty() || row.description.empty() ||
        row.why_no_queries.empty() != row.why_no_mechanisms.empty())
      return false;
  return true;
}(), "every row of kStudies needs a command, a study, a description, and both refusals or none");

}  // namespace hils::cli::studies
