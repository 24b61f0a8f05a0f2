// Gradients of the 1-D and adaptive poolings pooling.py exports as ATen nodes on torch's public
// operators (max_pool1d_with_indices, avg_pool1d, adaptive_avg_pool1d/3d), whose backward torch
// has no public operator for: eager autograd's own computations.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "autograd_vjp.h"

namespace {

using lightning_ort::vjp;

// torch's max_pool1d_with_indices is 2-D pooling over an inserted height of 1, which autograd
// differentiates with max_pool2d_with_indices_backward and the saved indices.
at::Tensor max_pool1d_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef kernel_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               bool ceil_mode, const at::Tensor& indices) {
  auto strides = stride.empty() ? kernel_size : stride;
  return at::max_pool2d_with_indices_backward(grad.unsqueeze(-2), self.unsqueeze(-2), {1, kernel_size[0]},
                                              {1, strides[0]}, {0, padding[0]}, {1, dilation[0]}, ceil_mode,
                                              indices.unsqueeze(-2))
      .squeeze(-2);
}

at::Tensor avg_pool1d_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef kernel_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                               bool count_include_pad) {
  std::vector<int64_t> kernel(kernel_size.begin(), kernel_size.end());
  std::vector<int64_t> strides(stride.begin(), stride.end());
  std::vector<int64_t> pads(padding.begin(), padding.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) {
    return at::avg_pool1d(inputs[0], kernel, strides, pads, ceil_mode, count_include_pad);
  };
  return vjp(forward, {self}, {true}, grad)[0];
}

// adaptive_avg_pool1d/3d take the mean where every output size is 1, adaptive pooling otherwise;
// autograd differentiates whichever ran.
at::Tensor adaptive_avg_pool1d_backward(const at::Tensor& grad, const at::Tensor& self,
                                        at::IntArrayRef output_size) {
  std::vector<int64_t> sizes(output_size.begin(), output_size.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) { return at::adaptive_avg_pool1d(inputs[0], sizes); };
  return vjp(forward, {self}, {true}, grad)[0];
}

at::Tensor adaptive_avg_pool3d_backward(const at::Tensor& grad, const at::Tensor& self,
                                        at::IntArrayRef output_size) {
  std::vector<int64_t> sizes(output_size.begin(), output_size.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) { return at::adaptive_avg_pool3d(inputs[0], sizes); };
  return vjp(forward, {self}, {true}, grad)[0];
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def(
      "max_pool1d_backward(Tensor grad, Tensor self, int[] kernel_size, int[] stride, int[] padding, "
      "int[] dilation, bool ceil_mode, Tensor indices) -> Tensor",
      &max_pool1d_backward);
  m.def(
      "avg_pool1d_backward(Tensor grad, Tensor self, int[] kernel_size, int[] stride, int[] padding, "
      "bool ceil_mode, bool count_include_pad) -> Tensor",
      &avg_pool1d_backward);
  m.def("adaptive_avg_pool1d_backward(Tensor grad, Tensor self, int[] output_size) -> Tensor",
        &adaptive_avg_pool1d_backward);
  m.def("adaptive_avg_pool3d_backward(Tensor grad, Tensor self, int[] output_size) -> Tensor",
        &adaptive_avg_pool3d_backward);
}
