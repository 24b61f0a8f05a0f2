// Channels-last forms of the 2-D convolution network layers (channels_last.py): ORT holds their
// activations as contiguous (N, H, W, C) tensors, which torch sees as (N, C, H, W) tensors in
// channels-last memory, views either way. torch's CPU kernels for convolutions, BatchNorm and
// pooling run faster in that memory (benchmarks/NOTES.md); they are the kernels eager autograd runs
// for a model in `torch.channels_last`. Weights and their gradients keep torch's standard layout.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "overloads.h"
#include "scales.h"

namespace {

using lightning_ort::Grads;
using lightning_ort::only_needed;

// An (N, H, W, C) tensor of ORT's as torch's (N, C, H, W) in channels-last memory.
at::Tensor nchw_view(const at::Tensor& nhwc) { return nhwc.permute({0, 3, 1, 2}); }

// A kernel's (N, C, H, W) result as the contiguous (N, H, W, C) tensor ORT holds: no copy when the
// kernel kept channels-last memory, as torch's do.
at::Tensor nhwc(const at::Tensor& nchw) { return nchw.defined() ? nchw.permute({0, 2, 3, 1}).contiguous() : nchw; }

at::Tensor standard(const at::Tensor& tensor) { return tensor.defined() ? tensor.contiguous() : tensor; }

// torch's channels-last convolution kernels lose to the standard ones where the weight is large against the
// activations (ResNet's last stages on small images: 512 channels at 2x2 ran 1.7-2.2x slower, 256 at 4x4
// 1.1-1.4x; benchmarks/NOTES.md 61). About half of that is converting the weight to channels-last and its
// gradient back on every call (ORT holds weights in standard memory), the rest the kernels themselves. Such
// layers run in standard memory, their (small) activations transposed in and out: eager's kernel for a model
// in standard memory, and its result for that layer.
bool standard_is_faster(const at::Tensor& weight, int64_t input_numel, int64_t output_numel) {
  return weight.numel() >= (int64_t{1} << 18) && 2 * weight.numel() >= 3 * (input_numel + output_numel);
}

int64_t at_index(at::IntArrayRef values, size_t index) { return values[std::min(index, values.size() - 1)]; }

// Elements of a (non-transposed) 2-D convolution's output for an (N, H, W, C) input.
int64_t output_numel(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                     at::IntArrayRef padding, at::IntArrayRef dilation) {
  int64_t numel = input.size(0) * weight.size(0);
  for (size_t axis = 0; axis < 2; ++axis) {
    int64_t size = input.size(1 + axis) + 2 * at_index(padding, axis) -
                   at_index(dilation, axis) * (weight.size(2 + axis) - 1) - 1;
    numel *= size / at_index(stride, axis) + 1;
  }
  return numel;
}

// The input of a convolution in the memory its kernels run fastest on (see standard_is_faster).
at::Tensor convolution_input(const at::Tensor& input, bool standard_memory) {
  return standard_memory ? nchw_view(input).contiguous() : nchw_view(input);
}

at::Tensor convolution_nhwc(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                            at::IntArrayRef output_padding, int64_t groups) {
  bool standard_memory =
      !transposed && standard_is_faster(weight, input.numel(), output_numel(input, weight, stride, padding, dilation));
  return nhwc(at::convolution(convolution_input(input, standard_memory), weight, c10::nullopt, stride, padding,
                              dilation, transposed, output_padding, groups));
}

at::Tensor convolution_bias_nhwc(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                 at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                 bool transposed, at::IntArrayRef output_padding, int64_t groups) {
  bool standard_memory =
      !transposed && standard_is_faster(weight, input.numel(), output_numel(input, weight, stride, padding, dilation));
  return nhwc(at::convolution(convolution_input(input, standard_memory), weight, bias, stride, padding, dilation,
                              transposed, output_padding, groups));
}

template <bool kInput, bool kWeight, bool kBias>
Grads convolution_nhwc_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                                const c10::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                                at::IntArrayRef output_padding, int64_t groups) {
  c10::optional<at::IntArrayRef> bias_sizes;
  if (bias.has_value()) bias_sizes = bias->sizes();
  // the forward's choice: the gradient has its output's size
  bool standard_memory = !transposed && standard_is_faster(weight, input.numel(), grad.numel());
  auto [grad_input, grad_weight, grad_bias] = only_needed<kInput, kWeight, kBias>(at::convolution_backward(
      convolution_input(grad, standard_memory), convolution_input(input, standard_memory), weight, bias_sizes, stride,
      padding, dilation, transposed, output_padding, groups, {kInput, kWeight, kBias && bias.has_value()}));
  return {nhwc(grad_input), standard(grad_weight), grad_bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_nhwc(const at::Tensor& input, const at::Tensor& weight,
                                                               const at::Tensor& bias, const at::Tensor& running_mean,
                                                               const at::Tensor& running_var, bool training,
                                                               double momentum, double eps) {
  auto [output, mean, invstd] =
      at::native_batch_norm(nchw_view(input), weight, bias, running_mean, running_var, training, momentum, eps);
  return {nhwc(output), mean, invstd};
}

template <bool kInput, bool kWeight, bool kBias>
Grads batch_norm_nhwc_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                               const at::Tensor& running_mean, const at::Tensor& running_var,
                               const at::Tensor& save_mean, const at::Tensor& save_invstd, bool training, double eps) {
  auto [grad_input, grad_weight, grad_bias] = only_needed<kInput, kWeight, kBias>(
      at::native_batch_norm_backward(nchw_view(grad), nchw_view(input), weight, running_mean, running_var, save_mean,
                                     save_invstd, training, eps, {kInput, kWeight, kBias}));
  return {nhwc(grad_input), grad_weight, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_nhwc(const at::Tensor& input, at::IntArrayRef kernel_size,
                                                   at::IntArrayRef stride, at::IntArrayRef padding,
                                                   at::IntArrayRef dilation, bool ceil_mode) {
  auto [output, indices] =
      at::max_pool2d_with_indices(nchw_view(input), kernel_size, stride, padding, dilation, ceil_mode);
  return {nhwc(output), nhwc(indices)};
}

at::Tensor max_pool2d_nhwc_backward(const at::Tensor& grad, const at::Tensor& input, at::IntArrayRef kernel_size,
                                    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                    bool ceil_mode, const at::Tensor& indices) {
  return nhwc(at::max_pool2d_with_indices_backward(nchw_view(grad), nchw_view(input), kernel_size, stride, padding,
                                                   dilation, ceil_mode, nchw_view(indices)));
}

at::Tensor avg_pool2d_nhwc(const at::Tensor& input, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                           at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                           c10::optional<int64_t> divisor_override) {
  return nhwc(
      at::avg_pool2d(nchw_view(input), kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override));
}

at::Tensor avg_pool2d_nhwc_backward(const at::Tensor& grad, const at::Tensor& input, at::IntArrayRef kernel_size,
                                    at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                                    bool count_include_pad, c10::optional<int64_t> divisor_override) {
  return nhwc(at::avg_pool2d_backward(nchw_view(grad), nchw_view(input), kernel_size, stride, padding, ceil_mode,
                                      count_include_pad, divisor_override));
}

at::Tensor adaptive_avg_pool2d_nhwc(const at::Tensor& input, at::IntArrayRef output_size) {
  return nhwc(at::_adaptive_avg_pool2d(nchw_view(input), output_size));
}

at::Tensor adaptive_avg_pool2d_nhwc_backward(const at::Tensor& grad, const at::Tensor& input) {
  return nhwc(at::_adaptive_avg_pool2d_backward(nchw_view(grad), nchw_view(input)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_nhwc(const at::Tensor& input,
                                                               const c10::optional<at::Tensor>& weight,
                                                               const c10::optional<at::Tensor>& bias, int64_t n,
                                                               int64_t c, int64_t hxw, int64_t group, double eps) {
  auto [output, mean, rstd] = at::native_group_norm(nchw_view(input), weight, bias, n, c, hxw, group, eps);
  return {nhwc(output), mean, rstd};
}

template <bool kInput, bool kWeight, bool kBias>
Grads group_norm_nhwc_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean,
                               const at::Tensor& rstd, const c10::optional<at::Tensor>& weight, int64_t n, int64_t c,
                               int64_t hxw, int64_t group) {
  // torch's channels-last kernel writes the input's gradient even when not asked for (SIGSEGV): always ask
  auto [grad_input, grad_weight, grad_bias] = only_needed<kInput, kWeight, kBias>(at::native_group_norm_backward(
      nchw_view(grad), nchw_view(input), mean, rstd, weight, n, c, hxw, group, {true, kWeight, kBias}));
  return {nhwc(grad_input), grad_weight, grad_bias};
}

// nearest-neighbour and bilinear upsampling (nn.Upsample, F.interpolate), with upsample.cc's
// float64 scale factors; gradients with the forward's scales, sizes read from the tensors
at::Tensor upsample_nearest2d_nhwc(const at::Tensor& input, at::OptionalIntArrayRef output_size,
                                   const c10::optional<at::Tensor>& scale_factors) {
  auto scales = lightning_ort::to_scales(scale_factors);
  return nhwc(at::upsample_nearest2d(nchw_view(input), output_size, lightning_ort::as_ref(scales)));
}

at::Tensor upsample_nearest2d_nhwc_backward(const at::Tensor& grad, const at::Tensor& input,
                                            const c10::optional<at::Tensor>& scale_factors) {
  auto scales = lightning_ort::to_scales(scale_factors);
  auto grad_nchw = nchw_view(grad);
  return nhwc(at::upsample_nearest2d_backward(grad_nchw, {grad_nchw.size(2), grad_nchw.size(3)},
                                              nchw_view(input).sizes(), lightning_ort::scale(scales, 0),
                                              lightning_ort::scale(scales, 1)));
}

at::Tensor upsample_bilinear2d_nhwc(const at::Tensor& input, at::OptionalIntArrayRef output_size, bool align_corners,
                                    const c10::optional<at::Tensor>& scale_factors) {
  auto scales = lightning_ort::to_scales(scale_factors);
  return nhwc(at::upsample_bilinear2d(nchw_view(input), output_size, align_corners, lightning_ort::as_ref(scales)));
}

at::Tensor upsample_bilinear2d_nhwc_backward(const at::Tensor& grad, const at::Tensor& input, bool align_corners,
                                             const c10::optional<at::Tensor>& scale_factors) {
  auto scales = lightning_ort::to_scales(scale_factors);
  auto grad_nchw = nchw_view(grad);
  return nhwc(at::upsample_bilinear2d_backward(grad_nchw, {grad_nchw.size(2), grad_nchw.size(3)},
                                               nchw_view(input).sizes(), align_corners,
                                               lightning_ort::scale(scales, 0), lightning_ort::scale(scales, 1)));
}

}  // namespace

#define POOL "int[] kernel_size, int[] stride, int[] padding"
#define AVG_POOL POOL ", bool ceil_mode, bool count_include_pad, int? divisor_override"

#define DEFINE_NHWC_OVERLOAD(overload, input, weight, bias)                                                   \
  m.def("convolution_nhwc" overload CONVOLUTION, &convolution_nhwc);                                         \
  m.def("convolution_bias_nhwc" overload CONVOLUTION_BIAS, &convolution_bias_nhwc);                          \
  m.def("convolution_nhwc_backward" overload CONVOLUTION_BACKWARD,                                           \
        &convolution_nhwc_backward<input, weight, bias>);                                                    \
  m.def("batch_norm_nhwc" overload BATCH_NORM, &batch_norm_nhwc);                                            \
  m.def("batch_norm_nhwc_backward" overload BATCH_NORM_BACKWARD, &batch_norm_nhwc_backward<input, weight, bias>); \
  m.def("group_norm_nhwc" overload GROUP_NORM, &group_norm_nhwc);                                             \
  m.def("group_norm_nhwc_backward" overload GROUP_NORM_BACKWARD, &group_norm_nhwc_backward<input, weight, bias>);

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  GRADIENT_OVERLOADS(DEFINE_NHWC_OVERLOAD)
  m.def("max_pool2d_nhwc(Tensor input, " POOL ", int[] dilation, bool ceil_mode) -> (Tensor, Tensor)",
        &max_pool2d_nhwc);
  m.def("max_pool2d_nhwc_backward(Tensor grad, Tensor input, " POOL
        ", int[] dilation, bool ceil_mode, Tensor indices) -> Tensor",
        &max_pool2d_nhwc_backward);
  m.def("avg_pool2d_nhwc(Tensor input, " AVG_POOL ") -> Tensor", &avg_pool2d_nhwc);
  m.def("avg_pool2d_nhwc_backward(Tensor grad, Tensor input, " AVG_POOL ") -> Tensor", &avg_pool2d_nhwc_backward);
  m.def("adaptive_avg_pool2d_nhwc(Tensor input, int[] output_size) -> Tensor", &adaptive_avg_pool2d_nhwc);
  m.def("adaptive_avg_pool2d_nhwc_backward(Tensor grad, Tensor input) -> Tensor", &adaptive_avg_pool2d_nhwc_backward);
  m.def("upsample_nearest2d_nhwc(Tensor input, int[]? output_size, Tensor? scale_factors) -> Tensor",
        &upsample_nearest2d_nhwc);
  m.def("upsample_nearest2d_nhwc_backward(Tensor grad, Tensor input, Tensor? scale_factors) -> Tensor",
        &upsample_nearest2d_nhwc_backward);
  m.def(
      "upsample_bilinear2d_nhwc(Tensor input, int[]? output_size, bool align_corners, Tensor? scale_factors) -> "
      "Tensor",
      &upsample_bilinear2d_nhwc);
  m.def(
      "upsample_bilinear2d_nhwc_backward(Tensor grad, Tensor input, bool align_corners, Tensor? scale_factors) -> "
      "Tensor",
      &upsample_bilinear2d_nhwc_backward);
}
