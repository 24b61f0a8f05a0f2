// Spatial sampling (sampling.py): F.grid_sample on torch's kernels, with eager autograd's own
// gradients (autograd_vjp.h). One overload per set of gradients a node needs
// (gradient_overloads.py): the plain name needs both, `.input` and `.grid` one.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "autograd_vjp.h"

namespace {

using lightning_ort::vjp;
using Pair = std::tuple<at::Tensor, at::Tensor>;

at::Tensor grid_sample(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation_mode,
                       int64_t padding_mode, bool align_corners) {
  return at::grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners);
}

template <bool kInput, bool kGrid>
Pair grid_sample_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& grid,
                          int64_t interpolation_mode, int64_t padding_mode, bool align_corners) {
  auto forward = [=](const std::vector<at::Tensor>& inputs) {
    return at::grid_sampler(inputs[0], inputs[1], interpolation_mode, padding_mode, align_corners);
  };
  auto grads = vjp(forward, {input, grid}, {kInput, kGrid}, grad);
  return {grads[0], grads[1]};
}

}  // namespace

#define GRID_SAMPLE "(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor"
#define GRID_SAMPLE_BACKWARD                                                                   \
  "(Tensor grad, Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool " \
  "align_corners) -> (Tensor, Tensor)"
#define DEFINE_GRID_SAMPLE_OVERLOAD(overload, input, grid) \
  m.def("grid_sample" overload GRID_SAMPLE, &grid_sample); \
  m.def("grid_sample_backward" overload GRID_SAMPLE_BACKWARD, &grid_sample_backward<input, grid>);

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  DEFINE_GRID_SAMPLE_OVERLOAD("", true, true)
  DEFINE_GRID_SAMPLE_OVERLOAD(".input", true, false)
  DEFINE_GRID_SAMPLE_OVERLOAD(".grid", false, true)
}
