// A study's own settings: the [study], [overlap] and [extrapolation] tables of its config (then
// the flags that override them), each checked as it is read.
#include <cmath>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/studies/study_config.hpp"

namespace hils::cli::studies {

namespace {

// BadInput when a list the study iterates over is empty: it would run nothing (or nothing of
// that part) and still write a results file.
template <class T>
void require_some(const std::vector<T>& list, const std::string& where, const std::string& what) {
  if (list.empty()) throw BadInput(where + ": expected at least one " + what + ", got []");
}

// A list's value as an error shows it: a name in quotes, a number as it is.
std::string shown(const std::string& name) { return "'" + name + "'"; }
template <class T>
std::string shown(T value) {
  return fmt::format("{}", value);
}

// BadInput when a list holds a value twice: each names a results group or a grid column, and the
// second one's datasets collided with the first's when written, after the work of every unit
// before them ("expected a dataset written once").
template <class T>
void require_distinct(const std::vector<T>& list, const std::string& where,
                      const std::string& what) {
  for (size_t i = 0; i < list.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (list[j] == list[i])
        throw BadInput(fmt::format("{}: expected distinct {}, got {} twice", where, what,
                                   shown(list[i])));
}

}  // namespace

// The [study] and [overlap] settings: mechanisms, queries, scores, the overlap's blocks.
void resolve_study_tables(Resolved& r, const StudyArgs& a, const config::ConfigValues& c) {
  r.mechanisms = c.texts("study", "mechanisms",
                         analysis::default_mechanism_names(r.geometry.landmarks));
  require_mechanism_names(r.mechanisms, r.prior.rule, c.where("study", "mechanisms"));
  require_some(r.mechanisms, c.where("study", "mechanisms"), "mechanism");
  require_distinct(r.mechanisms, c.where("study", "mechanisms"), "names");
  if (!a.mechanisms.empty()) r.mechanisms = a.mechanisms;
  require_mechanism_names(a.mechanisms, r.prior.rule, "--mechanisms");
  require_distinct(a.mechanisms, "--mechanisms", "names");
  // landmark_key scores a chunk by its landmark slot's key: without the layout a named
  // landmark_key was left out without a word (a study of it alone wrote no mechanism, exit 0,
  // and hils plot of that file failed), where lmk and landmark_key+<bias> are refused.
  for (const auto& name : r.mechanisms)
    if (name == "landmark_key" && !r.geometry.landmarks)
      throw BadInput(fmt::format(
          "{}: expected mechanisms that run without landmark slots (the study's --landmarks "
          "false), got 'landmark_key', which scores a chunk by its landmark slot's key",
          a.mechanisms.empty() ? c.where("study", "mechanisms") : "--mechanisms"));
  r.queries = a.queries ? *a.queries : c.integer("study", "queries", 32);
  r.keep_scores = c.boolean("study", "keep_scores", true);
  r.tail_queries = c.integer("overlap", "tail_queries", 256, 1);
  r.block_sizes = c.integers("overlap", "block_sizes", r.block_sizes, 1);
  r.final_block = c.integer("overlap", "final_block", r.final_block, 1);
  require_some(r.block_sizes, c.where("overlap", "block_sizes"), "block size");
  require_distinct(r.block_sizes, c.where("overlap", "block_sizes"), "block sizes");
  // A block of M adjacent queries needs M of the tail's queries: a larger one gave NaN overlaps.
  for (int64_t M : r.block_sizes)
    require(M <= r.tail_queries, c.where("overlap", "block_sizes"),
            "block sizes of at most tail_queries = " + std::to_string(r.tail_queries),
            std::to_string(M));
  require(r.final_block <= r.tail_queries, c.where("overlap", "final_block"),
          "at most tail_queries = " + std::to_string(r.tail_queries),
          std::to_string(r.final_block));
  r.overlap_mechanism = c.text("overlap", "mechanism", r.overlap_mechanism);
  require_mechanism_names({r.overlap_mechanism}, r.prior.rule, c.where("overlap", "mechanism"));
}

// The [extrapolation] settings: encodings, training length, RoPE, the needle grid.
void resolve_extrapolation_table(Resolved& r, const config::ConfigValues& c,
                                 const SourceDefaults& defaults) {
  const auto where = [&c](const char* key) { return c.where("extrapolation", key); };
  r.encodings = c.texts("extrapolation", "encodings", r.encodings);
  for (const auto& name : r.encodings) parse_positional_kind(name, where("encodings"));
  require_some(r.encodings, where("encodings"), "positional encoding");
  require_distinct(r.encodings, where("encodings"), "names");
  r.train_length = c.integer("extrapolation", "train_length", defaults.train_length, 1);
  r.theta = c.number("extrapolation", "theta", defaults.theta);
  require(std::isfinite(r.theta) && r.theta > 1.0, where("theta"),
          "a finite RoPE base greater than 1", std::to_string(r.theta));
  r.pairing = c.text("extrapolation", "pairing", defaults.pairing);
  parse_rope_pairing(r.pairing, where("pairing"));
  r.depths = c.numbers("extrapolation", "depths", r.depths);
  for (double depth : r.depths)
    require(depth >= 0.0 && depth <= 1.0, where("depths"), "needle depths in [0, 1]",
            std::to_string(depth));
  require_distinct(r.depths, where("depths"), "needle depths");
  r.needle_logit = c.number("extrapolation", "needle_logit", r.needle_logit);
  require(std::isfinite(r.needle_logit), where("needle_logit"), "a finite logit",
          std::to_string(r.needle_logit));
}

}  // namespace hils::cli::studies
