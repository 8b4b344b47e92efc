// A study run's settings, resolved from the study's defaults, the TOML config (study_schema) and
// the flags, in that order (study_config.cpp), checked (study_checks.cpp) and joined to their
// inputs (study_sources.cpp). Internal to the study commands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/studies/study_cli.hpp"
#include "config/config.hpp"
#include "hils/analysis/study.hpp"

namespace hils::cli::studies {

// Everything a study run needs.
struct Resolved {
  std::string source_kind;
  analysis::StudySource source;      // positioned inputs
  analysis::StudySource raw_source;  // un-rotated inputs (extrapolation)
  int64_t Hq = 0, Hkv = 0, dv = 0;   // the source's heads and value width (every layer)
  analysis::StudyGeometry geometry;
  analysis::PriorChoice prior;
  std::vector<std::string> mechanisms;
  int64_t queries = 32;
  int64_t tail_queries = 256;
  std::vector<int64_t> block_sizes{1, 2, 4, 8, 16, 32, 64};
  int64_t final_block = 16;
  std::vector<std::string> encodings{"rope", "hope", "nope"};
  int64_t train_length = 1024;
  double theta = 10000.0;
  std::string pairing = "half";
  std::vector<double> depths{0.0, 0.25, 0.5, 0.75, 1.0};
  double needle_logit = 6.0;
  std::string overlap_mechanism = "taylor_entropy";
  bool keep_scores = true;
  nlohmann::json config;  // what went into the run, for provenance and resume checks
  std::string activations;  // the activation file (--activations) when it is the source
};

// What a study's defaults follow from its source (study_config.cpp): the synthetic generators
// (lengths up to 2^20 slots, 2 layers, a train length of 1024, RoPE half), the model stories260K
// (its 512-slot context, 5 layers, 128, RoPE interleaved as llama2.c) or an activation file (its
// T, all its layers, 128, the file's RoPE where it has one, and its landmark layout where it has
// one: a file is studied whole by default, as the model is).
struct SourceDefaults {
  int64_t context = 1 << 20;   // the longest length a default length reaches
  bool whole_context = false;  // fidelity and overlap default to `context` alone
  int64_t layers = 2;
  int64_t train_length = 1024;
  std::string pairing = "half";
  double theta = 10000.0;
  // An activation file's chunk size S when its landmark slots are the HiLS layout of chunk size
  // S (slot (c+1)S-1 of every complete chunk): the study's default S, with landmarks on; 0 when
  // the file has no such layout (the model's geometry, landmarks off, stays the default).
  int64_t landmark_chunk = 0;
};

// study: the study of a row of kStudies ("fidelity", "overlap" or "extrapolation"). Throws
// BadInput naming the flag or the config key of the first value it cannot use; builds the inputs
// last.
Resolved resolve(const StudyArgs& args, const std::string& study);

// The study's mechanisms with the run's geometry, each validated (resolve_study_tables refuses
// landmark_key where the layout has no landmark slots).
std::vector<analysis::StudyMechanism> mechanisms_of(const Resolved& r);

// study_tables.cpp: r's mechanisms, queries, scores and overlap blocks from [study] and
// [overlap] (then --mechanisms, --queries), and its encodings, RoPE and needle grid from
// [extrapolation] (its train length and RoPE default to the source's); r.geometry and r.prior
// must be resolved.
void resolve_study_tables(Resolved& r, const StudyArgs& args, const config::ConfigValues& c);
void resolve_extrapolation_table(Resolved& r, const config::ConfigValues& c,
                                 const SourceDefaults& defaults);

// study_sources.cpp: r.source, r.raw_source and r.config["source"] from the source kind, the
// layers and lengths already in r, and the config's [source] table. BadInput naming
// `lengths_where` when the longest length cannot fit in memory or exceeds the source.
void build_sources(Resolved& r, const StudyArgs& args, const config::ConfigValues& c,
                   const std::string& lengths_where);

// study_checks.cpp: each throws BadInput naming where the value was set.
// S, W >= 1, K >= 0, queries >= 1, 1 <= layers (<= 128 for the synthetic source).
void require_study_values(const Resolved& r, const config::ConfigValues& c);
// K within what one unit's outputs allow in memory (r's source, lengths, queries resolved).
void require_outputs_fit(const Resolved& r, const config::ConfigValues& c, const StudyRow& row);
// Positive, strictly ascending lengths.
void require_ascending_lengths(const std::vector<int64_t>& lengths, const std::string& where);
// Every length long enough to hold a query with a retrieval candidate (T > W + S).
void require_retrieval_candidates(const std::vector<int64_t>& lengths,
                                  const analysis::StudyGeometry& geometry,
                                  const std::string& where);
// Each mechanism name known (a preset, mean, ..., <key>+<bias>).
void require_mechanism_names(const std::vector<std::string>& names, PriorRule rule,
                             const std::string& where);

}  // namespace hils::cli::studies
