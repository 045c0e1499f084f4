// Per-op calibration from the bench (docs/calibration.md, "Per-op rates"): every kind of work the runtime
// runs gets its own measured rate instead of sharing one, so a fitted profile prices each op from its own
// measurement and the trace fit has nothing to trade between kinds.
//
// - Element-wise kinds (norm, activation, cross-entropy, embedding, optimizer) and the attention core, each
//   forward and backward apart, from the bench's runtime-kernel rows: the rate at which the rows' per-step
//   total is right (fit.cpp's rule: sum n_i (t_i - c) / sum n_i a_i, a_i the bytes or FLOPs the cost model
//   charges, n_i the per-step count, c the kernel overhead).
// - GEMM classes: the input- and weight-gradient GEMMs (transposed operands) as the time over the tile model's
//   of their rows, by the same total rule.
// - Contention: the same rows run on N threads at once (`tessel bench --concurrent N`) over alone, per kind:
//   the host model's slowdown with every core busy (sim/engine/host_model.hpp).
// - Each collective's own latency and bandwidth (fit.cpp's per-collective alpha/beta) into node.collectives.
// - Noise: the rows' repeat variation (their `spread`), reported with the fit.
#pragma once

#include <string>
#include <vector>

#include "sim/calibrate/bench_data.hpp"
#include "sim/calibrate/fit.hpp"
#include "sim/system.hpp"

namespace tessel::calib {

// The kind and direction a runtime kernel row is charged as; false for a name of no kind.
bool kernel_kind(const std::string& kernel, CostKind& kind, bool& backward);

// Sets profile.gpu.kernel_Bps and attention_flops (only with rows of both directions) from the kernel rows
// (overhead c per row). InputError naming the bench file when a kind's rows do not determine a positive rate.
std::vector<KindFit> fit_kind_rates(const BenchData& b, double c, System& profile);

// Sets profile.gpu.gemm_dgrad_factor / gemm_wgrad_factor from the rows of those classes against the tile
// model of `profile` (fitted on the forward rows). Returns the residual categories "gemm dgrad", "gemm wgrad".
std::vector<Residuals> fit_gemm_classes(const std::vector<GemmRow>& rows, Precision p, System& profile);

// `busy`: the rows of `alone` measured on busy.concurrent threads at once. Sets profile.host (cores =
// busy.concurrent, contention per kind: the kernel rows' busy total over their alone total, weighted by their
// per-step counts; the GEMM grid's and the STREAM rows' median row ratio; glue takes the STREAM rows'
// (`memory`) factor, being copies and adds of the same kind), and each grid kind's steadiness (ContentionFit).
// InputError naming both files when the documents' rows do not match one to one.
std::vector<ContentionFit> fit_contention(const BenchData& alone, const BenchData& busy, System& profile);

// node.collectives from the per-collective alpha/beta (each with a positive bandwidth).
void set_collective_links(const std::vector<LinkFit>& links, System& profile);

// The median spread of the rows that carry one (a fraction); -1 when none does.
double bench_noise(const BenchData& b);

}  // namespace tessel::calib
