// hils studies: every study of kStudies (fidelity, overlap, extrapolation) on a built-in default
// in ~20-30 s on 2 cores, with the real model's runs when its files are there, then their plots.
#include <chrono>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "cli/cli_util.hpp"
#include "cli/commands.hpp"
#include "cli/plot/draw_plots.hpp"
#include "cli/spec_flags.hpp"
#include "cli/studies/study_cli.hpp"
#include "parallel/session.hpp"
#include "util/shared_data.hpp"

namespace hils::cli {

namespace {

// -> "fidelity, overlap and extrapolation": the studies of kStudies.
std::string study_names() {
  std::vector<std::string_view> names;
  for (const auto& row : studies::kStudies) names.push_back(row.study);
  return studies::listed(names);
}

}  // namespace

// hils studies: every study on the built-in default, then the plots.
void register_studies(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "studies",
      "Run the " + study_names() + " studies on the built-in default (synthetic "
      "activations, and the real stories260K model when ../shared/data or --model-dir has it) "
      "and draw their plots.\nExample: hils studies --out results/");
  auto out = std::make_shared<std::string>("results");
  auto model_dir = std::make_shared<std::string>();
  auto skip_model = std::make_shared<bool>(false);
  auto jobs = std::make_shared<std::optional<int64_t>>();
  add_output_option(cmd, out.get(), "folder for the results files and plots (created)");
  cmd->add_option("--model-dir", *model_dir, "folder of the real model's files");
  cmd->add_flag("--no-model", *skip_model, "skip the real-model runs");
  add_jobs_option(cmd, jobs.get());
  cmd->callback([out, model_dir, skip_model, jobs] {
    const std::filesystem::path folder = *out;
    make_output_folder(folder, "--out");
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::filesystem::path> files;
    for (const auto& row : studies::kStudies) {
      studies::StudyArgs a;
      a.jobs = *jobs;
      a.out = (folder / (std::string(row.study) + "_synthetic.h5")).string();
      if (row.study == "extrapolation") {
        // A lighter sweep than `hils extrapolate`'s default (7 lengths) to keep this run short.
        a.layers = 1;
        a.queries = 8;
        a.lengths = {1024, 4096, 16384, 65536};
      }
      files.push_back(studies::run_study(row, a));
    }
    const std::filesystem::path data =
        model_dir->empty() ? shared_data_dir() : std::filesystem::path(*model_dir);
    if (!*skip_model && std::filesystem::exists(data / "stories260K.bin")) {
      for (const auto& row : studies::kStudies) {
        if (!row.in_model_studies) continue;
        studies::StudyArgs m;
        m.jobs = *jobs;
        m.source = "model";
        m.model_dir = data.string();
        m.out = (folder / (std::string(row.study) + "_stories260K.h5")).string();
        files.push_back(studies::run_study(row, m));
      }
    } else if (!*skip_model) {
      std::cerr << "studies: no real model at " << data.string()
                << " (stories260K.bin); skipping the real-model runs\n";
    }
    if (!parallel::holds_results()) return;
    std::vector<std::filesystem::path> pngs;
    for (const auto& f : files)
      for (const auto& p : draw_plots(f, folder / "plots", "--out")) pngs.push_back(p);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("studies: {} results files and {} plots in {:.0f} s\n",
                             files.size(), pngs.size(), s);
    for (const auto& f : files) std::cout << "  results: " << f.string() << "\n";
    std::cout << "  plots:   " << (folder / "plots").string() << "/\n";
  });
}

}  // namespace hils::cli
