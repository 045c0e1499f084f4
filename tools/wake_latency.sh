#!/usr/bin/env bash
# How long a rank that is woken waits for its core when another rank computes on it (docs/calibration.md, "The
# host model"): the question a host model with time slices has to answer before it charges a wait per hand-off.
#
#   tools/wake_latency.sh [WAKES]      (default 400; needs g++ and 2 or more CPUs; about 5 s)
#
# Three threads: a waiter pinned to CPU 0, asleep on a condition variable; a waker pinned to CPU 1 that notes
# the time and wakes it every 3-7 ms; and, in the second half, a spinner pinned to CPU 0 as well, computing
# without pause (a rank whose core-mate computes). The waiter notes when it runs again; the difference is the
# wake-up latency. Printed per case: median, 90th and 99th percentiles and the largest, in microseconds.
# Built into a temporary folder at run time, not by meson: a measurement of the host, not of Tessel.
set -euo pipefail
wakes=${1:-400}
if [ "$(nproc)" -lt 2 ]; then
  echo "wake_latency: needs 2 or more CPUs (this machine has $(nproc))" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/wake.cpp" <<'CPP'
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static std::vector<double> measure(int wakes, bool spinner) {
  std::mutex m;
  std::condition_variable cv;
  long posted = 0, seen = 0;
  Clock::time_point sent;
  std::vector<double> lat;
  std::atomic<bool> stop{false};
  std::thread spin;
  if (spinner)
    spin = std::thread([&] {
      pin(0);
      volatile double x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });
  std::thread waiter([&] {
    pin(0);
    std::unique_lock<std::mutex> l(m);
    while (seen < wakes) {
      cv.wait(l, [&] { return posted > seen; });
      const auto now = Clock::now();
      lat.push_back(std::chrono::duration<double, std::micro>(now - sent).count());
      ++seen;
    }
  });
  std::thread waker([&] {
    pin(1);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> gap_us(3000, 7000);
    for (int i = 0; i < wakes; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(gap_us(rng)));
      {
        std::lock_guard<std::mutex> g(m);
        sent = Clock::now();
        ++posted;
      }
      cv.notify_one();
      // Next wake only after this one was seen, so each latency is one wake's.
      for (;;) {
        std::lock_guard<std::mutex> g(m);
        if (seen == posted) break;
      }
    }
  });
  waker.join();
  waiter.join();
  stop = true;
  if (spin.joinable()) spin.join();
  return lat;
}

static void report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto q = [&](double p) { return v[static_cast<std::size_t>(p * (v.size() - 1))]; };
  std::printf("%-34s wakes %4zu  median %8.1f us  p90 %8.1f us  p99 %8.1f us  max %8.1f us\n", what, v.size(), q(0.5),
              q(0.9), q(0.99), v.back());
}

int main(int argc, char** argv) {
  const int wakes = argc > 1 ? std::atoi(argv[1]) : 400;
  report("core 0 idle", measure(wakes, false));
  report("core 0 computing (another thread)", measure(wakes, true));
  return 0;
}
CPP
g++ -O2 -std=c++20 -pthread "$tmp/wake.cpp" -o "$tmp/wake"
echo "wake_latency: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $(uname -sr), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$tmp/wake" "$wakes"
