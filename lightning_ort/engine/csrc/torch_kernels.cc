// torch kernels that ORT graphs run through ATen nodes (ORT's aten_op_executor), as operators of the
// `lightning_ort` namespace: convolutions, linear layers, GELU, ReLU, LayerNorm, attention without
// dropout (torch_kernels.py), the matmul, masked_fill and softmax of attention written out by hand
// (matmul_softmax.py), and BatchNorm (batchnorm.py).
//
// ORT's executor passes only tensors, ints, floats and bools (and lists of them), and ORT's gradient
// graph cannot produce `convolution_backward`'s bias_sizes; these thin wrappers give torch's
// kernels executor-friendly schemas. They call the same ATen functions eager PyTorch's autograd
// calls, so results are identical to eager.
//
// Gradients a graph does not need must stay undefined (ORT has no place for them). ORT keys
// gradient definitions by the forward node's overload name, so each operator with parameters has
// one overload per set of gradients needed, named after them (`input_bias`: frozen weight, as in
// bias-only fine-tuning; `weight_bias`: a first layer, whose images need no gradient; ...); the
// plain name needs all of them. The forward overloads all run the same kernel.

#include <Python.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/library.h>

#include <limits>
#include <tuple>

#include "autograd_vjp.h"
#include "overloads.h"

namespace {

using lightning_ort::Grads;
using lightning_ort::only_needed;

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

template <bool kInput, bool kWeight, bool kBias>
Grads convolution_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                           at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups) {
  c10::optional<at::IntArrayRef> bias_sizes;
  if (bias.has_value()) bias_sizes = bias->sizes();
  return only_needed<kInput, kWeight, kBias>(at::convolution_backward(grad, input, weight, bias_sizes, stride, padding,
                                                                      dilation, transposed, output_padding, groups,
                                                                      {kInput, kWeight, kBias && bias.has_value()}));
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight) { return at::linear(input, weight); }

at::Tensor linear_bias(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  return at::linear(input, weight, bias);
}

// What eager autograd computes for linear (addmm/mm on the flattened rows), same kernels.
template <bool kInput, bool kWeight, bool kBias>
Grads linear_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                      const c10::optional<at::Tensor>& bias) {
  at::Tensor grad_input, grad_weight, grad_bias;
  if (kInput) grad_input = at::matmul(grad, weight);
  auto rows = grad.reshape({-1, grad.size(-1)});
  if (kWeight) grad_weight = rows.t().mm(input.reshape({-1, input.size(-1)}));
  if (kBias && bias.has_value()) grad_bias = rows.sum(0);
  return {grad_input, grad_weight, grad_bias};
}

// ORT gives the gradient node of a two-input forward node two outputs, so no third, empty one.
template <bool kInput, bool kWeight, bool kBias>
std::tuple<at::Tensor, at::Tensor> linear_backward_no_bias(const at::Tensor& grad, const at::Tensor& input,
                                                           const at::Tensor& weight) {
  auto grads = linear_backward<kInput, kWeight, false>(grad, input, weight, c10::nullopt);
  return {std::get<0>(grads), std::get<1>(grads)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm(const at::Tensor& input, const at::Tensor& weight,
                                                          const at::Tensor& bias, const at::Tensor& running_mean,
                                                          const at::Tensor& running_var, bool training,
                                                          double momentum, double eps) {
  return at::native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps);
}

template <bool kInput, bool kWeight, bool kBias>
Grads batch_norm_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& save_mean,
                          const at::Tensor& save_invstd, bool training, double eps) {
  return only_needed<kInput, kWeight, kBias>(at::native_batch_norm_backward(
      grad, input, weight, running_mean, running_var, save_mean, save_invstd, training, eps, {kInput, kWeight, kBias}));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor& input, const at::Tensor& weight,
                                                          const at::Tensor& bias, at::IntArrayRef normalized_shape,
                                                          double eps) {
  return at::native_layer_norm(input, normalized_shape, weight, bias, eps);
}

template <bool kInput, bool kWeight, bool kBias>
Grads layer_norm_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& bias, at::IntArrayRef normalized_shape, const at::Tensor& mean,
                          const at::Tensor& rstd) {
  return only_needed<kInput, kWeight, kBias>(at::native_layer_norm_backward(grad, input, normalized_shape, mean, rstd,
                                                                             weight, bias, {kInput, kWeight, kBias}));
}

at::Tensor gelu(const at::Tensor& input, bool tanh) { return at::gelu(input, tanh ? "tanh" : "none"); }

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& input, bool tanh) {
  return at::gelu_backward(grad, input, tanh ? "tanh" : "none");
}

at::Tensor relu(const at::Tensor& input) { return at::relu(input); }

// eager's ReLU backward: from the output, as autograd does
at::Tensor relu_backward(const at::Tensor& grad, const at::Tensor& output) {
  return at::threshold_backward(grad, output, 0);
}

// scaled_dot_product_attention without dropout. Eager PyTorch picks a backend for it: on CPU its
// flash-attention kernels when the inputs allow, or else the math path. The same choice here, so
// forward and backward are the kernels eager autograd runs; `logsumexp` is the flash kernels'
// saved statistic (unused on the math path).
constexpr int64_t kFlashAttention = 1;  // sdp::SDPBackend::flash_attention

bool uses_flash(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                const c10::optional<at::Tensor>& mask, c10::optional<double> scale, bool is_causal) {
  return at::_fused_sdp_choice(query, key, value, mask, 0.0, is_causal, scale, false) == kFlashAttention;
}

// `transposed`: query, key, value and the output are (batch, length, heads, dim) tensors, the
// transpose(1, 2) of attention's (batch, heads, length, dim), and the kernels take views of them.
// The flash kernels keep (batch, length, heads, dim) memory for their output and gradients, so a
// graph that wants that layout (nn.MultiheadAttention, most hand-written attention) copies nothing.
at::Tensor heads_second(const at::Tensor& tensor, bool transposed) {
  return transposed ? tensor.transpose(1, 2) : tensor;
}

// ORT hands boolean tensors over as uint8 (DLPack); a view of the same bytes as bool
at::Tensor as_bool(const at::Tensor& mask) { return mask.scalar_type() == at::kByte ? mask.view(at::kBool) : mask; }

// An attention mask as given to eager's scaled_dot_product_attention: a uint8 one was boolean
// (eager accepts no integer masks).
c10::optional<at::Tensor> given_mask(const c10::optional<at::Tensor>& mask) {
  return mask.has_value() ? c10::optional<at::Tensor>(as_bool(*mask)) : mask;
}

// The mask the flash kernels take for a boolean one (True: attend), as eager's
// scaled_dot_product_attention converts it before calling them: 0 where True, -inf where False.
c10::optional<at::Tensor> additive_mask(const c10::optional<at::Tensor>& mask, const at::Tensor& query) {
  if (!mask.has_value() || mask->scalar_type() != at::kBool) return mask;
  return at::zeros_like(*mask, query.options()).masked_fill_(mask->logical_not(),
                                                              -std::numeric_limits<double>::infinity());
}

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& query_, const at::Tensor& key_, const at::Tensor& value_,
                                             const c10::optional<at::Tensor>& mask_, c10::optional<double> scale,
                                             bool is_causal, bool transposed) {
  auto mask = given_mask(mask_);
  auto query = heads_second(query_, transposed), key = heads_second(key_, transposed),
       value = heads_second(value_, transposed);
  if (uses_flash(query, key, value, mask, scale, is_causal)) {
    auto [output, logsumexp] = at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                                               additive_mask(mask, query), scale);
    return {heads_second(output, transposed), logsumexp};
  }
  auto statistic_sizes = query.sizes().slice(0, query.dim() - 1);
  auto output = at::scaled_dot_product_attention(query, key, value, mask, 0.0, is_causal, scale);
  return {heads_second(output, transposed), at::empty(statistic_sizes, query.options().dtype(at::kFloat))};
}

template <bool kQuery, bool kKey, bool kValue, bool kMask>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& grad_, const at::Tensor& query_, const at::Tensor& key_, const at::Tensor& value_,
    const c10::optional<at::Tensor>& mask_, c10::optional<double> scale, bool is_causal, bool transposed,
    const at::Tensor& output_, const at::Tensor& logsumexp) {
  auto mask = given_mask(mask_);
  auto grad = heads_second(grad_, transposed), query = heads_second(query_, transposed),
       key = heads_second(key_, transposed), value = heads_second(value_, transposed);
  at::Tensor grad_query, grad_key, grad_value, grad_mask;
  if (!kMask && uses_flash(query, key, value, mask, scale, is_causal)) {
    std::tie(grad_query, grad_key, grad_value) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad, query, key, value, heads_second(output_, transposed), logsumexp, 0.0, is_causal,
        additive_mask(mask, query), scale);
  } else {  // the math path (or a mask that needs a gradient): recomputed, differentiated by autograd
    c10::AutoGradMode grad_mode(true);
    std::vector<at::Tensor> inputs = {query.detach().requires_grad_(), key.detach().requires_grad_(),
                                      value.detach().requires_grad_()};
    c10::optional<at::Tensor> attention_mask = mask;
    if (kMask && mask.has_value() && mask->is_floating_point()) {  // a boolean mask has no gradient
      attention_mask = mask->detach().requires_grad_();
      inputs.push_back(*attention_mask);
    }
    auto recomputed = at::scaled_dot_product_attention(inputs[0], inputs[1], inputs[2], attention_mask, 0.0,
                                                       is_causal, scale);
    lightning_ort::GilReleased gil_released;
    auto grads = torch::autograd::grad({recomputed}, inputs, {grad});
    grad_query = grads[0];
    grad_key = grads[1];
    grad_value = grads[2];
    if (grads.size() > 3) grad_mask = grads[3];
  }
  grad_query = kQuery ? heads_second(grad_query, transposed) : at::Tensor();
  grad_key = kKey ? heads_second(grad_key, transposed) : at::Tensor();
  grad_value = kValue ? heads_second(grad_value, transposed) : at::Tensor();
  return {grad_query, grad_key, grad_value, grad_mask};
}

// matmul, either side possibly given as its transpose (last two dimensions swapped: `k` for
// `q @ k.transpose(-2, -1)`), which becomes a view here instead of ORT's copy. Gradients come back
// in the layout of the tensor given, summed over broadcast dimensions as autograd does.
at::Tensor last_two_swapped(const at::Tensor& tensor, bool swapped) {
  return swapped ? tensor.transpose(-2, -1) : tensor;
}

at::Tensor matmul(const at::Tensor& self, const at::Tensor& other, bool transpose_self, bool transpose_other) {
  return at::matmul(last_two_swapped(self, transpose_self), last_two_swapped(other, transpose_other));
}

template <bool kSelf, bool kOther>
std::tuple<at::Tensor, at::Tensor> matmul_backward(const at::Tensor& grad, const at::Tensor& self_,
                                                   const at::Tensor& other_, bool transpose_self,
                                                   bool transpose_other) {
  auto self = last_two_swapped(self_, transpose_self), other = last_two_swapped(other_, transpose_other);
  auto grad_t = grad.transpose(-2, -1);
  at::Tensor grad_self, grad_other;
  if (kSelf) {
    grad_self = transpose_self ? at::matmul(other, grad_t) : at::matmul(grad, other.transpose(-2, -1));
    grad_self = grad_self.sum_to_size(self_.sizes());
  }
  if (kOther) {
    grad_other = transpose_other ? at::matmul(grad_t, self) : at::matmul(self.transpose(-2, -1), grad);
    grad_other = grad_other.sum_to_size(other_.sizes());
  }
  return {grad_self, grad_other};
}

// softmax and masked_fill as eager autograd computes them (attention written out by hand)
at::Tensor softmax(const at::Tensor& input, int64_t dim) { return at::_softmax(input, dim, false); }

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim) {
  return at::_softmax_backward_data(grad, output, dim, output.scalar_type());
}

// `input_sizes` (unused forward): masked_fill broadcasts `input` against `mask`, and the gradient is
// summed back to the input's shape, as autograd's engine does
at::Tensor masked_fill(const at::Tensor& input, const at::Tensor& mask, const at::Tensor& value,
                       at::IntArrayRef input_sizes) {
  return at::masked_fill(input, as_bool(mask), value);
}

at::Tensor masked_fill_backward(const at::Tensor& grad, const at::Tensor& mask, at::IntArrayRef input_sizes) {
  return grad.masked_fill(as_bool(mask), 0).sum_to_size(input_sizes);
}

}  // namespace

#define LINEAR "(Tensor input, Tensor weight) -> Tensor"
#define LINEAR_BIAS "(Tensor input, Tensor weight, Tensor bias) -> Tensor"
#define LINEAR_BACKWARD "(Tensor grad, Tensor input, Tensor weight, Tensor? bias) -> (Tensor, Tensor, Tensor)"
#define LINEAR_BACKWARD_NO_BIAS "(Tensor grad, Tensor input, Tensor weight) -> (Tensor, Tensor)"
#define LAYER_NORM \
  "(Tensor input, Tensor weight, Tensor bias, int[] normalized_shape, float eps) -> (Tensor, Tensor, Tensor)"
#define LAYER_NORM_BACKWARD                                                                              \
  "(Tensor grad, Tensor input, Tensor weight, Tensor bias, int[] normalized_shape, Tensor mean, Tensor rstd) " \
  "-> (Tensor, Tensor, Tensor)"

#define DEFINE_OVERLOAD(overload, input, weight, bias)                                                       \
  m.def("convolution" overload CONVOLUTION, &convolution);                                                  \
  m.def("convolution_bias" overload CONVOLUTION_BIAS, &convolution_bias);                                   \
  m.def("convolution_backward" overload CONVOLUTION_BACKWARD, &convolution_backward<input, weight, bias>);  \
  m.def("linear" overload LINEAR, &linear);                                                                 \
  m.def("linear_bias" overload LINEAR_BIAS, &linear_bias);                                                  \
  m.def("linear_backward" overload LINEAR_BACKWARD, &linear_backward<input, weight, bias>);                 \
  m.def("linear_backward_no_bias" overload LINEAR_BACKWARD_NO_BIAS, &linear_backward_no_bias<input, weight, bias>); \
  m.def("batch_norm" overload BATCH_NORM, &batch_norm);                                                     \
  m.def("batch_norm_backward" overload BATCH_NORM_BACKWARD, &batch_norm_backward<input, weight, bias>);     \
  m.def("layer_norm" overload LAYER_NORM, &layer_norm);                                                     \
  m.def("layer_norm_backward" overload LAYER_NORM_BACKWARD, &layer_norm_backward<input, weight, bias>);

// The same for attention's query, key, value and mask.
#define ATTENTION_OVERLOADS(DEF)                    \
  DEF("", true, true, true, true)                   \
  DEF(".query_key_value", true, true, true, false)  \
  DEF(".query_key_mask", true, true, false, true)   \
  DEF(".query_key", true, true, false, false)       \
  DEF(".query_value_mask", true, false, true, true) \
  DEF(".query_value", true, false, true, false)     \
  DEF(".query_mask", true, false, false, true)      \
  DEF(".query", true, false, false, false)          \
  DEF(".key_value_mask", false, true, true, true)   \
  DEF(".key_value", false, true, true, false)       \
  DEF(".key_mask", false, true, false, true)        \
  DEF(".key", false, true, false, false)            \
  DEF(".value_mask", false, false, true, true)      \
  DEF(".value", false, false, true, false)          \
  DEF(".mask", false, false, false, true)

#define ATTENTION                                                                                         \
  "(Tensor query, Tensor key, Tensor value, Tensor? mask, float? scale, bool is_causal, bool transposed) " \
  "-> (Tensor, Tensor)"
#define ATTENTION_BACKWARD                                                                              \
  "(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor? mask, float? scale, bool is_causal, " \
  "bool transposed, Tensor output, Tensor logsumexp) -> (Tensor, Tensor, Tensor, Tensor)"
#define DEFINE_ATTENTION_OVERLOAD(overload, query, key, value, mask) \
  m.def("attention" overload ATTENTION, &attention);                 \
  m.def("attention_backward" overload ATTENTION_BACKWARD, &attention_backward<query, key, value, mask>);

// The same for matmul's two sides.
#define MATMUL "(Tensor self, Tensor other, bool transpose_self, bool transpose_other) -> Tensor"
#define MATMUL_BACKWARD \
  "(Tensor grad, Tensor self, Tensor other, bool transpose_self, bool transpose_other) -> (Tensor, Tensor)"
#define DEFINE_MATMUL_OVERLOAD(overload, self, other) \
  m.def("matmul" overload MATMUL, &matmul);           \
  m.def("matmul_backward" overload MATMUL_BACKWARD, &matmul_backward<self, other>);

TORCH_LIBRARY(lightning_ort, m) {
  GRADIENT_OVERLOADS(DEFINE_OVERLOAD)
  ATTENTION_OVERLOADS(DEFINE_ATTENTION_OVERLOAD)
  DEFINE_MATMUL_OVERLOAD("", true, true)
  DEFINE_MATMUL_OVERLOAD(".self", true, false)
  DEFINE_MATMUL_OVERLOAD(".other", false, true)
  m.def("softmax(Tensor input, int dim) -> Tensor", &softmax);
  m.def("softmax_backward(Tensor grad, Tensor output, int dim) -> Tensor", &softmax_backward);
  m.def("masked_fill(Tensor input, Tensor mask, Tensor value, int[] input_sizes) -> Tensor", &masked_fill);
  m.def("masked_fill_backward(Tensor grad, Tensor mask, int[] input_sizes) -> Tensor", &masked_fill_backward);
  m.def("gelu(Tensor input, bool tanh) -> Tensor", &gelu);
  m.def("gelu_backward(Tensor grad, Tensor input, bool tanh) -> Tensor", &gelu_backward);
  m.def("relu(Tensor input) -> Tensor", &relu);
  m.def("relu_backward(Tensor grad, Tensor output) -> Tensor", &relu_backward);
}
