// hils run's units: one per (layer, mechanism), each reading its layer (LayerReader), running the
// mechanism on the reference and writing its outputs to the results sink.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/run/run_plan.hpp"
#include "hils/analysis/units.hpp"

namespace hils::cli::run_command {

// The layers the units in flight read, each kept for the next unit of the same layer (units are
// listed layer by layer); one layer per unit running at once is held, never all of them.
class LayerReader {
 public:
  LayerReader(std::string input, const io::ActivationMeta& meta)
      : loads_([input = std::move(input), meta](const int64_t& layer) {
          return io::read_activation_layer(input, meta, layer);
        }) {}
  // The layer, read once for the units that use it at the same time or one after another (the
  // unused one is freed before the next is read; safe with units on several threads).
  std::shared_ptr<const io::LayerActivations> get(int64_t layer) { return loads_.get(layer); }

 private:
  analysis::SharedLoads<int64_t, io::LayerActivations> loads_;
};

// One unit per (layer, mechanism), layer by layer, all of equal estimated cost, so that the
// schedule (analysis::schedule_order) is this list order under any runner. plan, meta, input,
// options and layers must outlive the units.
std::vector<analysis::StudyUnit> list_units(const RunPlan& plan, const io::ActivationMeta& meta,
                                            const std::string& input, const RunOptions& options,
                                            LayerReader& layers);

}  // namespace hils::cli::run_command
