// SPDX-License-Identifier: Apache-2.0
// DeadlineMonitor: one thread, a map of deadlines; CallWithDeadline.
#include "runtime/comm/deadline_monitor.h"

#include <future>
#include <memory>
#include <utility>
#include <vector>

namespace dptrain {

DeadlineMonitor::~DeadlineMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

DeadlineMonitor::Id DeadlineMonitor::Watch(Clock::time_point deadline,
                                           std::function<void()> on_expiry) {
  Id id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    due_.emplace(deadline, std::make_pair(id, std::move(on_expiry)));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_all();  // the new deadline may be the earliest
  return id;
}

void DeadlineMonitor::Done(Id id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = due_.begin(); it != due_.end(); ++it) {
    if (it->second.first == id) {
      due_.erase(it);
      return;
    }
  }
}

size_t DeadlineMonitor::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return due_.size();
}

int64_t DeadlineMonitor::expired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expired_;
}

void DeadlineMonitor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (due_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto first = due_.begin()->first;
    if (Clock::now() < first) {
      cv_.wait_until(lock, first);
      continue;
    }
    // Run every action that is due, outside the lock (an action may take time: ncclCommAbort).
    std::vector<std::function<void()>> run;
    while (!due_.empty() && due_.begin()->first <= Clock::now()) {
      run.push_back(std::move(due_.begin()->second.second));
      due_.erase(due_.begin());
      ++expired_;
    }
    lock.unlock();
    for (auto& f : run) f();
    lock.lock();
  }
}

DeadlineMonitor& DeadlineMonitor::Shared() {
  // Never destroyed: handles may outlive static destruction order on exit paths.
  static auto* monitor = new DeadlineMonitor();
  return *monitor;
}

bool CallWithDeadline(std::function<void()> fn, double seconds) noexcept {
  try {
    auto task = std::make_shared<std::packaged_task<void()>>(std::move(fn));
    std::future<void> done = task->get_future();
    std::thread t([task] { (*task)(); });
    const bool in_time =
        done.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
    if (in_time) {
      t.join();
    } else {
      t.detach();
    }
    return in_time;
  } catch (...) {
    return false;  // no thread could be started: nothing ran
  }
}

}  // namespace dptrain
