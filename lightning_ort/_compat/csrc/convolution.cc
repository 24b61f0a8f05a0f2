// Convolutions inside ORT graphs on torch's kernels, as operators of the `lightning_ort` namespace
// that ORT runs through its ATen executor (see lightning_ort/_compat/op_rewrites.py).
//
// ORT's executor passes only tensors, ints, floats and bools (and lists of them), and ORT's gradient
// graph cannot produce `convolution_backward`'s bias_sizes; these thin wrappers give torch's
// kernels executor-friendly schemas. They call the same ATen functions eager PyTorch's autograd
// calls, so results are identical to eager.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace {

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups) {
  return at::convolution(input, weight, c10::nullopt, stride, padding, dilation, transposed, output_padding, groups);
}

at::Tensor convolution_bias(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                            at::IntArrayRef output_padding, int64_t groups) {
  return at::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
}

// Where the input needs no gradient (a first layer's images), ORT has no place for it and the slot
// must stay undefined: that is the `frozen_input` overload.
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_gradients(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    bool input_grad, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups) {
  c10::optional<at::IntArrayRef> bias_sizes;
  if (bias.has_value()) bias_sizes = bias->sizes();
  return at::convolution_backward(grad, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                  output_padding, groups, {input_grad, true, bias.has_value()});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups) {
  return convolution_gradients(grad, input, weight, bias, true, stride, padding, dilation, transposed, output_padding,
                               groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_frozen_input(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups) {
  return convolution_gradients(grad, input, weight, bias, false, stride, padding, dilation, transposed,
                               output_padding, groups);
}

}  // namespace

TORCH_LIBRARY(lightning_ort, m) {
#define LAYOUT "int[] stride, int[] padding, int[] dilation, bool transposed, int[] output_padding, int groups"
  // The `frozen_input` forward overloads are the same kernels: ORT keys gradient definitions by
  // overload, and layers whose input needs no gradient get a definition without it.
  m.def("convolution(Tensor input, Tensor weight, " LAYOUT ") -> Tensor", &convolution);
  m.def("convolution.frozen_input(Tensor input, Tensor weight, " LAYOUT ") -> Tensor", &convolution);
  m.def("convolution_bias(Tensor input, Tensor weight, Tensor bias, " LAYOUT ") -> Tensor", &convolution_bias);
  m.def("convolution_bias.frozen_input(Tensor input, Tensor weight, Tensor bias, " LAYOUT ") -> Tensor",
        &convolution_bias);
  m.def("convolution_backward(Tensor grad, Tensor input, Tensor weight, Tensor? bias, " LAYOUT
        ") -> (Tensor, Tensor, Tensor)",
        &convolution_backward);
  m.def("convolution_backward.frozen_input(Tensor grad, Tensor input, Tensor weight, Tensor? bias, " LAYOUT
        ") -> (Tensor, Tensor, Tensor)",
        &convolution_backward_frozen_input);
#undef LAYOUT
}
