// SPDX-License-Identifier: Apache-2.0
// Collective watchdog. The monitor thread polls every 50 ms; arrival reports are 64-byte messages
// sent with MPI_Send on a private duplicate of MPI_COMM_WORLD (eager: never blocks in practice).
#include "runtime/comm/watchdog.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/comm/mpi_communicator.h"

namespace dptrain {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

// An arrival report: what a rank entered (the name travels as text: pointers and ids are
// per-process).
struct Report {
  int64_t seq;
  int64_t step;
  char what[48];
};

struct State {
  double timeout_s = 0;
  bool use_mpi = false;
  int rank = 0, world = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  std::thread monitor;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> step{-1};
  std::atomic<int64_t> seq{0};         // collectives entered
  std::atomic<int64_t> entered_ms{0};  // 0 = not in a collective
  std::atomic<const char*> what{""};
  std::vector<std::function<void()>> hooks;
  // Rank 0: last report of every rank.
  struct Seen {
    int64_t seq = 0, step = -1, at_ms = 0;
    std::string what;
    int64_t heard_ms = 0;  // last message of any kind (arrival report or heartbeat)
  };
  std::vector<Seen> seen;
};

State* g = nullptr;
constexpr int kTag = 4242;

[[noreturn]] void Fire() {
  const int64_t waited = (NowMs() - g->entered_ms.load()) / 1000;
  std::string msg = RankTag() + "collective timeout: " + g->what.load() + " at step " +
                    std::to_string(g->step.load()) + " did not complete within " +
                    std::to_string(static_cast<int64_t>(g->timeout_s)) + " s (waited " +
                    std::to_string(waited) + " s; dist.collective_timeout_s)";
  if (g->rank == 0 && g->use_mpi) {
    const int64_t mine = g->seq.load();
    std::string missing;
    const int64_t now = NowMs();
    for (int r = 1; r < g->world; ++r) {
      const auto& s = g->seen[static_cast<size_t>(r)];
      // A rank that reached the collective but whose monitor thread went silent (heartbeats
      // every second) is stopped or dead inside it: it did not arrive at its end either.
      const bool silent = s.heard_ms > 0 && now - s.heard_ms > 1500;
      if (s.seq >= mine && !silent) continue;
      if (s.seq >= mine) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (in " + s.what +
                   " at step " + std::to_string(s.step) + " but silent for " +
                   std::to_string((now - s.heard_ms) / 1000) + " s: stopped or dead)";
        continue;
      }
      missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (last seen ";
      if (!s.what.empty()) {
        missing += "in " + s.what + " at step " + std::to_string(s.step) + ", " +
                   std::to_string((now - s.at_ms) / 1000) + " s ago)";
      } else {
        missing += "never)";
      }
    }
    msg += missing.empty() ? "; every rank reached it: a rank may have died inside it"
                           : "; ranks that did not arrive: " + missing;
  }
  msg +=
      "; hint: a stopped or crashed rank, a deadlock in user code, or a network problem; "
      "raise dist.collective_timeout_s for very slow steps";
  std::fprintf(stderr, "dptrain: error: %s\n", msg.c_str());
  std::fflush(stderr);
  for (auto& h : g->hooks) {
    try {
      h();
    } catch (...) {
    }
  }
  MpiSession::Abort(kExitComm);
}

void MonitorLoop() {
  int64_t last_beat = 0;
  while (!g->stop.load()) {
    if (g->use_mpi && g->rank == 0) {
      // Drain arrival reports.
      for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, kTag, g->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
        Report rep;
        MPI_Recv(&rep, sizeof rep, MPI_BYTE, st.MPI_SOURCE, kTag, g->comm, MPI_STATUS_IGNORE);
        auto& s = g->seen[static_cast<size_t>(st.MPI_SOURCE)];
        s.heard_ms = NowMs();
        if (rep.seq < 0) continue;  // heartbeat
        s.seq = rep.seq;
        s.step = rep.step;
        s.what.assign(rep.what, strnlen(rep.what, sizeof rep.what));
        s.at_ms = NowMs();
      }
    }
    if (g->use_mpi && g->rank != 0 && NowMs() - last_beat >= 1000) {
      // Heartbeat: lets rank 0 tell a rank stopped inside a collective from one still in it.
      Report beat{-1, g->step.load(), {}};
      MPI_Send(&beat, sizeof beat, MPI_BYTE, 0, kTag, g->comm);
      last_beat = NowMs();
    }
    // Rank 0 fires first (it can name the missing ranks); the others give it a grace period
    // and fire themselves only if rank 0 is the one that is stuck.
    const double limit_ms = 1000.0 * g->timeout_s + (g->rank == 0 ? 0.0 : 3000.0);
    const int64_t t0 = g->entered_ms.load();
    if (t0 != 0 && static_cast<double>(NowMs() - t0) > limit_ms) Fire();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

void Watchdog::Start(double timeout_s, bool can_use_mpi_from_thread) {
  if (timeout_s <= 0 || g != nullptr) return;
  g = new State();
  g->timeout_s = timeout_s;
  g->use_mpi = can_use_mpi_from_thread;
  MPI_Comm_rank(MPI_COMM_WORLD, &g->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g->world);
  if (g->use_mpi) {
    MPI_Comm_dup(MPI_COMM_WORLD, &g->comm);
    g->seen.resize(static_cast<size_t>(g->world));
  }
  g->monitor = std::thread(MonitorLoop);
}

void Watchdog::Stop() {
  if (g == nullptr) return;
  g->stop.store(true);
  if (g->monitor.joinable()) g->monitor.join();
  if (g->comm != MPI_COMM_NULL) {
    // Reports that were never received would keep MPI_Finalize waiting on some transports.
    if (g->rank == 0) {
      for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, kTag, g->comm, &flag, &st);
        if (!flag) break;
        Report rep;
        MPI_Recv(&rep, sizeof rep, MPI_BYTE, st.MPI_SOURCE, kTag, g->comm, MPI_STATUS_IGNORE);
      }
    }
    MPI_Comm_free(&g->comm);
  }
  delete g;
  g = nullptr;
}

bool Watchdog::running() { return g != nullptr; }

void Watchdog::SetStep(int64_t step) {
  if (g != nullptr) g->step.store(step);
}

void Watchdog::AddAbortHook(std::function<void()> hook) {
  if (g != nullptr) g->hooks.push_back(std::move(hook));
}

Watchdog::Scope::Scope(const char* what) : active_(g != nullptr && g->entered_ms.load() == 0) {
  if (!active_) return;  // not running, or nested inside another scope
  const int64_t seq = g->seq.fetch_add(1) + 1;
  g->what.store(what);
  g->entered_ms.store(NowMs());
  if (g->use_mpi && g->rank != 0) {
    Report rep{seq, g->step.load(), {}};
    std::strncpy(rep.what, what, sizeof rep.what - 1);
    MPI_Send(&rep, sizeof rep, MPI_BYTE, 0, kTag, g->comm);
  }
}

Watchdog::Scope::~Scope() {
  if (active_) g->entered_ms.store(0);
}

}  // namespace dptrain
