// torch kernels that ORT graphs run through ATen nodes (ORT's aten_op_executor), as operators of the
// `lightning_ort` namespace: convolutions (op_rewrites.py) and BatchNorm (batchnorm.py).
//
// ORT's executor passes only tensors, ints, floats and bools (and lists of them), and ORT's gradient
// graph cannot produce `convolution_backward`'s bias_sizes; these thin wrappers give torch's
// kernels executor-friendly schemas. They call the same ATen functions eager PyTorch's autograd
// calls, so results are identical to eager.
//
// Gradients a graph does not need must stay undefined (ORT has no place for them). ORT keys
// gradient definitions by the forward node's overload name, so each operator has overloads that say
// which inputs need no gradient: `frozen_input` (a first layer's images, layers after frozen ones)
// and `frozen_params` (frozen or non-affine weights). The forward overloads are the same kernels.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

enum class Frozen { kNone, kInput, kParams };

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

template <Frozen frozen>
Grads convolution_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                           at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups) {
  c10::optional<at::IntArrayRef> bias_sizes;
  if (bias.has_value()) bias_sizes = bias->sizes();
  bool params = frozen != Frozen::kParams;
  return at::convolution_backward(grad, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                  output_padding, groups, {frozen != Frozen::kInput, params, params && bias.has_value()});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm(const at::Tensor& input, const at::Tensor& weight,
                                                          const at::Tensor& bias, const at::Tensor& running_mean,
                                                          const at::Tensor& running_var, bool training,
                                                          double momentum, double eps) {
  return at::native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps);
}

template <Frozen frozen>
Grads batch_norm_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& save_mean,
                          const at::Tensor& save_invstd, bool training, double eps) {
  bool params = frozen != Frozen::kParams;
  return at::native_batch_norm_backward(grad, input, weight, running_mean, running_var, save_mean, save_invstd,
                                        training, eps, {frozen != Frozen::kInput, params, params});
}

}  // namespace

TORCH_LIBRARY(lightning_ort, m) {
#define LAYOUT "int[] stride, int[] padding, int[] dilation, bool transposed, int[] output_padding, int groups"
#define CONVOLUTION "(Tensor input, Tensor weight, " LAYOUT ") -> Tensor"
#define CONVOLUTION_BIAS "(Tensor input, Tensor weight, Tensor bias, " LAYOUT ") -> Tensor"
#define CONVOLUTION_BACKWARD \
  "(Tensor grad, Tensor input, Tensor weight, Tensor? bias, " LAYOUT ") -> (Tensor, Tensor, Tensor)"
#define BATCH_NORM                                                                                     \
  "(Tensor input, Tensor weight, Tensor bias, Tensor running_mean, Tensor running_var, bool training, " \
  "float momentum, float eps) -> (Tensor, Tensor, Tensor)"
#define BATCH_NORM_BACKWARD                                                                   \
  "(Tensor grad, Tensor input, Tensor weight, Tensor running_mean, Tensor running_var, "        \
  "Tensor save_mean, Tensor save_invstd, bool training, float eps) -> (Tensor, Tensor, Tensor)"
  m.def("convolution" CONVOLUTION, &convolution);
  m.def("convolution.frozen_input" CONVOLUTION, &convolution);
  m.def("convolution.frozen_params" CONVOLUTION, &convolution);
  m.def("convolution_bias" CONVOLUTION_BIAS, &convolution_bias);
  m.def("convolution_bias.frozen_input" CONVOLUTION_BIAS, &convolution_bias);
  m.def("convolution_bias.frozen_params" CONVOLUTION_BIAS, &convolution_bias);
  m.def("convolution_backward" CONVOLUTION_BACKWARD, &convolution_backward<Frozen::kNone>);
  m.def("convolution_backward.frozen_input" CONVOLUTION_BACKWARD, &convolution_backward<Frozen::kInput>);
  m.def("convolution_backward.frozen_params" CONVOLUTION_BACKWARD, &convolution_backward<Frozen::kParams>);
  m.def("batch_norm" BATCH_NORM, &batch_norm);
  m.def("batch_norm.frozen_input" BATCH_NORM, &batch_norm);
  m.def("batch_norm.frozen_params" BATCH_NORM, &batch_norm);
  m.def("batch_norm_backward" BATCH_NORM_BACKWARD, &batch_norm_backward<Frozen::kNone>);
  m.def("batch_norm_backward.frozen_input" BATCH_NORM_BACKWARD, &batch_norm_backward<Frozen::kInput>);
  m.def("batch_norm_backward.frozen_params" BATCH_NORM_BACKWARD, &batch_norm_backward<Frozen::kParams>);
#undef LAYOUT
#undef CONVOLUTION
#undef CONVOLUTION_BIAS
#undef CONVOLUTION_BACKWARD
#undef BATCH_NORM
#undef BATCH_NORM_BACKWARD
}
