// ProgressBar: redraws with "\r" on a terminal, plain lines elsewhere.
#include "training/callbacks/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "parallel/distributed.h"
#include "training/config/config.h"
#include "utils/logging.h"
#include "utils/strings.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

std::string compact(double value) {
  if (value >= 1e9) return fmt::format("{:.1f}G", value / 1e9);
  if (value >= 1e6) return fmt::format("{:.1f}M", value / 1e6);
  if (value >= 1e3) return fmt::format("{:.1f}k", value / 1e3);
  return fmt::format("{:.1f}", value);
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options) : options_(std::move(options)) {
  if (options_.width < 1 || options_.width > 500) {
    throw std::invalid_argument("ProgressBar.width is " + std::to_string(options_.width) + "; use 1 to 500");
  }
  if (!(options_.refresh_seconds >= 0.0)) {
    throw std::invalid_argument(
        fmt::format("ProgressBar.refresh_seconds is {:.6g}; use 0 or more", options_.refresh_seconds));
  }
  if (!(options_.line_seconds >= 0.0)) {
    throw std::invalid_argument(
        fmt::format("ProgressBar.line_seconds is {:.6g}; use 0 or more", options_.line_seconds));
  }
  if (options_.stream == nullptr) options_.stream = stdout;
}

void ProgressBar::on_train_start(CallbackContext& ctx) {
  active_ = parallel::is_last_rank();
  if (!active_) return;
  terminal_ = options_.terminal.value_or(::isatty(::fileno(options_.stream)) == 1);
  start_step_ = step_ = ctx.state.train_state.step;
  total_ = ctx.state.cfg != nullptr ? ctx.state.cfg->train.train_iters : 0;
  tokens_per_step_ = ctx.state.cfg != nullptr
                         ? static_cast<double>(ctx.state.cfg->train.global_batch_size * ctx.state.cfg->model.seq_length)
                         : 0.0;
  start_ = last_draw_ = Clock::now();
  paused_ = {};
  drawn_ = false;
}

double ProgressBar::train_seconds() const {
  return std::chrono::duration<double>(Clock::now() - start_ - paused_).count();
}

std::string ProgressBar::render(std::int64_t steps_done, std::int64_t total) const {
  const double fraction = total > 0 ? std::clamp(static_cast<double>(steps_done) / total, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(fraction * options_.width);
  std::string line = fmt::format("step {}/{} [{}{}] {:3.0f}%", steps_done, total, std::string(filled, '#'),
                                 std::string(options_.width - filled, '-'), 100.0 * fraction);
  if (loss_) line += fmt::format(" | loss {:.4f}", *loss_);
  const double seconds = train_seconds();
  const std::int64_t done = step_ - start_step_;
  if (done > 0 && seconds > 0.0) {
    if (tokens_per_step_ > 0.0) line += " | " + compact(tokens_per_step_ * done / seconds) + " tokens/s";
    line += " | ETA " + bridge::utils::format_duration(seconds / done * static_cast<double>(total - steps_done));
  }
  return line;
}

void ProgressBar::draw(bool final) {
  const std::string line = render(step_, total_);
  if (terminal_) {
    std::fprintf(options_.stream, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
    drawn_ = !final;
  } else {
    std::fprintf(options_.stream, "%s\n", line.c_str());
  }
  std::fflush(options_.stream);
  last_draw_ = Clock::now();
}

void ProgressBar::on_train_step_end(CallbackContext& ctx) {
  if (!active_) return;
  step_ = ctx.iteration();  // the steps done, this one included
  const double since = std::chrono::duration<double>(Clock::now() - last_draw_).count();
  if (since >= (terminal_ ? options_.refresh_seconds : options_.line_seconds)) draw(/*final=*/false);
}

void ProgressBar::on_eval_start(CallbackContext&) {
  if (!active_) return;
  eval_start_ = Clock::now();
  if (drawn_) {  // evaluation logs its own line
    std::fprintf(options_.stream, "\r\033[K");
    std::fflush(options_.stream);
    drawn_ = false;
  }
}

void ProgressBar::on_eval_end(CallbackContext&) {
  if (active_) paused_ += Clock::now() - eval_start_;
}

void ProgressBar::on_log(CallbackContext& ctx) {
  if (!active_) return;
  if (const auto it = ctx.log->metrics.find(options_.loss); it != ctx.log->metrics.end()) loss_ = it->second;
  if (drawn_) {  // the log line comes next: leave it a clean line; the next step draws the bar again
    std::fprintf(options_.stream, "\r\033[K");
    std::fflush(options_.stream);
    drawn_ = false;
  }
}

void ProgressBar::on_train_end(CallbackContext& ctx) {
  if (!active_) return;
  step_ = ctx.state.train_state.step;
  draw(/*final=*/true);
  active_ = false;
}

}  // namespace callbacks
}  // namespace bridge::training
