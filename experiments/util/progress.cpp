#include "util/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace hils {

namespace {

constexpr double kDelaySeconds = 2.0;    // runs shorter than this never show a bar
constexpr double kRedrawSeconds = 0.2;   // at most five redraws a second
constexpr int kBarWidth = 28;

std::string clock_text(double seconds) {
  auto total = static_cast<int64_t>(seconds + 0.5);
  if (total >= 3600) return fmt::format("{}h{:02}m", total / 3600, (total / 60) % 60);
  return fmt::format("{}:{:02}", total / 60, total % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, bool quiet)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(!quiet && ::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(int64_t units) {
  done_ = std::min(total_, done_ + units);
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double since_draw = std::chrono::duration<double>(now - last_draw_).count();
  if (elapsed < kDelaySeconds || (drawn_ && since_draw < kRedrawSeconds)) return;
  last_draw_ = now;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (drawn_) draw(true);
}

// "label [#######.......] 123/456 heads  12.3 heads/s  0:42 left"
void ProgressBar::draw(bool final) {
  double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  int filled = static_cast<int>(kBarWidth * done_ / total_);
  std::string bar(filled, '#');
  bar += std::string(kBarWidth - filled, '.');
  std::string tail = final ? fmt::format("{} total", clock_text(elapsed))
                     : rate > 0 ? fmt::format("{} left", clock_text((total_ - done_) / rate))
                                : std::string("? left");
  std::fprintf(stderr, "\r%s [%s] %lld/%lld %s  %.3g %s/s  %s\x1b[K%s", label_.c_str(),
               bar.c_str(), static_cast<long long>(done_), static_cast<long long>(total_),
               unit_.c_str(), rate, unit_.c_str(), tail.c_str(), final ? "\n" : "");
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace hils
