// What lightning_ort's operator files share: gradients of up to three inputs, and the overloads
// that say which of them a node needs (see the top of torch_kernels.cc).

#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace lightning_ort {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Some kernels compute more than asked (oneDNN's convolution backward returns the weight's gradient
// along with the bias's); ORT fails on a gradient it has no place for, so drop what was not asked.
template <bool kInput, bool kWeight, bool kBias>
Grads only_needed(Grads grads) {
  if (!kInput) std::get<0>(grads) = at::Tensor();
  if (!kWeight) std::get<1>(grads) = at::Tensor();
  if (!kBias) std::get<2>(grads) = at::Tensor();
  return grads;
}

}  // namespace lightning_ort

// The overloads for each set of gradients a node needs. A missing bias (`convolution`) is simply
// not computed, whatever the overload says.
#define GRADIENT_OVERLOADS(DEF)           \
  DEF("", true, true, true)               \
  DEF(".input_weight", true, true, false) \
  DEF(".input_bias", true, false, true)   \
  DEF(".weight_bias", false, true, true)  \
  DEF(".input", true, false, false)       \
  DEF(".weight", false, true, false)      \
  DEF(".bias", false, false, true)

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
#define GROUP_NORM \
  "(Tensor input, Tensor? weight, Tensor? bias, int n, int c, int hxw, int group, float eps) -> (Tensor, Tensor, Tensor)"
#define GROUP_NORM_BACKWARD                                                                                  \
  "(Tensor grad, Tensor input, Tensor mean, Tensor rstd, Tensor? weight, int n, int c, int hxw, int group) " \
  "-> (Tensor, Tensor, Tensor)"
