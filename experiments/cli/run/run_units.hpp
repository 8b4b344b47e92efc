// hils run's units: one per (layer, mechanism), each reading its layer (LayerReader), running the
// mechanism on the reference and writing its outputs to the results sink.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/run/run_plan.hpp"
#include "hils/analysis/units.hpp"

namespace hils::cli::run_command {

// The layer the last unit of this process read, kept for the next unit of the same layer
// (units are listed layer by layer); one layer is held at a time, never all of them.
class LayerReader {
 public:
  LayerReader(std::string input, const io::ActivationMeta& meta)
      : input_(std::move(input)), meta_(meta) {}
  const io::LayerActivations& get(int64_t layer) {
    if (layer != index_) {
      data_ = io::LayerActivations{};  // free the old layer before reading the next
      data_ = io::read_activation_layer(input_, meta_, layer);
      index_ = layer;
    }
    return data_;
  }

 private:
  std::string input_;
  io::ActivationMeta meta_;
  int64_t index_ = -1;
  io::LayerActivations data_;
};

// One unit per (layer, mechanism), layer by layer, all of equal estimated cost, so that the
// schedule (analysis::schedule_order) is this list order under any runner. plan, meta, input,
// options and layers must outlive the units.
std::vector<analysis::StudyUnit> list_units(const RunPlan& plan, const io::ActivationMeta& meta,
                                            const std::string& input, const RunOptions& options,
                                            LayerReader& layers);

}  // namespace hils::cli::run_command
