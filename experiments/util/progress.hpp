// A one-line progress bar on stderr with rate and time left. It draws only when stderr is a
// terminal, the run has lasted more than ~2 s, and it is not silenced (--quiet), so scripts and
// logs never see it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace hils {

class ProgressBar {
 public:
  // total: units of work (> 0); unit: what one unit is called ("heads", "tokens").
  ProgressBar(std::string label, int64_t total, std::string unit, bool quiet);
  ~ProgressBar();  // finishes the line if anything was drawn
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void advance(int64_t units = 1);
  void finish();

 private:
  void draw(bool final);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool enabled_, drawn_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace hils
