// runtime/host_sched.hpp: the calling thread's CPU time and run-queue delay from Linux's schedstat. A thread
// that spins gains CPU time about as fast as the wall clock; one that sleeps gains almost none. Where the
// kernel gives no counters (not Linux, or schedstats compiled out) thread_sched() says so with nullopt.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "runtime/host_sched.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double spin_for(double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  volatile double x = 1;
  while (Clock::now() < end) x = x * 1.0000001 + 1e-9;
  return x;
}

}  // namespace

TEST_CASE("thread_sched: spinning counts as CPU time, sleeping does not") {
  const auto a = tessel::rt::thread_sched();
  if (!a) {
    MESSAGE("no /proc/thread-self/schedstat on this kernel: nothing to check");
    return;
  }
  const auto t0 = Clock::now();
  spin_for(0.2);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto b = tessel::rt::thread_sched();
  REQUIRE(b);
  const double cpu = b->cpu_s - a->cpu_s, waited = b->run_delay_s - a->run_delay_s;
  // Spinning: every moment of the wall time was either on a CPU or waiting for one (other load on the host).
  CHECK(cpu > 0);
  CHECK(cpu <= wall + 1e-3);
  CHECK(waited >= 0);
  CHECK(cpu + waited >= 0.95 * wall);
  // Sleeping: the thread neither runs nor waits on a run queue.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto c = tessel::rt::thread_sched();
  REQUIRE(c);
  CHECK(c->cpu_s - b->cpu_s < 0.05);
  CHECK(c->run_delay_s - b->run_delay_s < 0.05);
}
