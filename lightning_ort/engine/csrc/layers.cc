// Layers ORT 1.19.2 cannot train (layers.py): PReLU, InstanceNorm, GroupNorm and BatchNorm without
// running statistics or affine parameters, and EmbeddingBag on torch's kernels, with eager
// autograd's own gradients (autograd_vjp.h). PReLU and the affine normalizations have one overload
// per set of gradients a node needs (gradient_overloads.py).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "autograd_vjp.h"
#include "overloads.h"

namespace {

using lightning_ort::Grads;
using lightning_ort::vjp;

at::Tensor prelu(const at::Tensor& self, const at::Tensor& weight) { return at::prelu(self, weight); }

template <bool kSelf, bool kWeight>
std::tuple<at::Tensor, at::Tensor> prelu_backward(const at::Tensor& grad, const at::Tensor& self,
                                                  const at::Tensor& weight) {
  auto forward = [](const std::vector<at::Tensor>& inputs) { return at::prelu(inputs[0], inputs[1]); };
  auto grads = vjp(forward, {self, weight}, {kSelf, kWeight}, grad);
  return {grads[0], grads[1]};
}

// Normalizations over the batch's own statistics, with optional affine weight and bias.
using Norm = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);

at::Tensor instance_norm_of(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return at::instance_norm(input, weight, bias, {}, {}, /*use_input_stats=*/true, /*momentum=*/0.1, eps,
                           /*cudnn_enabled=*/false);
}

// BatchNorm without running statistics (track_running_stats=False): batch statistics in every mode
at::Tensor batch_statistics_norm_of(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                    double eps) {
  return at::batch_norm(input, weight, bias, {}, {}, /*training=*/true, /*momentum=*/0.1, eps,
                        /*cudnn_enabled=*/false);
}

template <Norm kNorm>
at::Tensor norm(const at::Tensor& input, double eps) {
  return kNorm(input, {}, {}, eps);
}

template <Norm kNorm>
at::Tensor norm_backward(const at::Tensor& grad, const at::Tensor& input, double eps) {
  auto forward = [eps](const std::vector<at::Tensor>& inputs) { return kNorm(inputs[0], {}, {}, eps); };
  return vjp(forward, {input}, {true}, grad)[0];
}

template <Norm kNorm>
at::Tensor norm_affine(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return kNorm(input, weight, bias, eps);
}

template <Norm kNorm, bool kInput, bool kWeight, bool kBias>
Grads norm_affine_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, double eps) {
  auto forward = [eps](const std::vector<at::Tensor>& inputs) { return kNorm(inputs[0], inputs[1], inputs[2], eps); };
  auto grads = vjp(forward, {input, weight, bias}, {kInput, kWeight, kBias}, grad);
  return {grads[0], grads[1], grads[2]};
}

// GroupNorm with affine parameters, as torch's native_group_norm (the form channels_last.py rewrites):
// ORT's gradient of native_group_norm failed where the input needs no gradient (a first layer, a
// frozen stem). torch's channels-last kernel writes the input's gradient even when not asked for
// (SIGSEGV), so it is always asked for.
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_affine(const at::Tensor& input,
                                                                 const c10::optional<at::Tensor>& weight,
                                                                 const c10::optional<at::Tensor>& bias, int64_t n,
                                                                 int64_t c, int64_t hxw, int64_t group, double eps) {
  return at::native_group_norm(input, weight, bias, n, c, hxw, group, eps);
}

template <bool kInput, bool kWeight, bool kBias>
Grads group_norm_affine_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean,
                                 const at::Tensor& rstd, const c10::optional<at::Tensor>& weight, int64_t n,
                                 int64_t c, int64_t hxw, int64_t group) {
  return lightning_ort::only_needed<kInput, kWeight, kBias>(
      at::native_group_norm_backward(grad, input, mean, rstd, weight, n, c, hxw, group, {true, kWeight, kBias}));
}

// GroupNorm without affine parameters
at::Tensor group_norm(const at::Tensor& input, int64_t groups, double eps) {
  return at::group_norm(input, groups, {}, {}, eps, /*cudnn_enabled=*/false);
}

at::Tensor group_norm_backward(const at::Tensor& grad, const at::Tensor& input, int64_t groups, double eps) {
  auto forward = [groups, eps](const std::vector<at::Tensor>& inputs) { return group_norm(inputs[0], groups, eps); };
  return vjp(forward, {input}, {true}, grad)[0];
}

// Only the bags, as torch's own export: the operator's other outputs (offset2bag, bag_size,
// max_indices) serve its backward, which recomputes them.
at::Tensor embedding_bag(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets,
                            bool scale_grad_by_freq, int64_t mode, bool include_last_offset, int64_t padding_idx) {
  // -1 stands for no padding index (F.embedding_bag turns a negative one into its row number); torch's
  // operator would take it for the last row
  auto padding = padding_idx < 0 ? c10::nullopt : c10::optional<int64_t>(padding_idx);
  return std::get<0>(at::embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, /*sparse=*/false, {},
                                       include_last_offset, padding));
}

at::Tensor embedding_bag_backward(const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& indices,
                                  const at::Tensor& offsets, bool scale_grad_by_freq, int64_t mode,
                                  bool include_last_offset, int64_t padding_idx) {
  auto forward = [&](const std::vector<at::Tensor>& inputs) {
    return embedding_bag(inputs[0], indices, offsets, scale_grad_by_freq, mode, include_last_offset, padding_idx);
  };
  return vjp(forward, {weight}, {true}, grad)[0];
}

}  // namespace

#define PRELU_BACKWARD "(Tensor grad, Tensor self, Tensor weight) -> (Tensor, Tensor)"
#define NORM_AFFINE "(Tensor input, Tensor weight, Tensor bias, float eps) -> Tensor"
#define NORM_AFFINE_BACKWARD \
  "(Tensor grad, Tensor input, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)"
#define DEFINE_NORM_OVERLOAD(overload, input, weight, bias)                                                        \
  m.def("instance_norm_affine" overload NORM_AFFINE, &norm_affine<instance_norm_of>);                               \
  m.def("instance_norm_affine_backward" overload NORM_AFFINE_BACKWARD,                                              \
        &norm_affine_backward<instance_norm_of, input, weight, bias>);                                              \
  m.def("batch_statistics_norm_affine" overload NORM_AFFINE, &norm_affine<batch_statistics_norm_of>);               \
  m.def("batch_statistics_norm_affine_backward" overload NORM_AFFINE_BACKWARD,                                      \
        &norm_affine_backward<batch_statistics_norm_of, input, weight, bias>);                                     \
  m.def("group_norm_affine" overload GROUP_NORM, &group_norm_affine);                                               \
  m.def("group_norm_affine_backward" overload GROUP_NORM_BACKWARD,                                                  \
        &group_norm_affine_backward<input, weight, bias>);
#define EMBEDDING_BAG_ARGUMENTS \
  "Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq, int mode, bool include_last_offset, " \
  "int padding_idx"

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("prelu(Tensor self, Tensor weight) -> Tensor", &prelu);
  m.def("prelu.self(Tensor self, Tensor weight) -> Tensor", &prelu);
  m.def("prelu.weight(Tensor self, Tensor weight) -> Tensor", &prelu);
  m.def("prelu_backward" PRELU_BACKWARD, &prelu_backward<true, true>);
  m.def("prelu_backward.self" PRELU_BACKWARD, &prelu_backward<true, false>);
  m.def("prelu_backward.weight" PRELU_BACKWARD, &prelu_backward<false, true>);
  m.def("instance_norm(Tensor input, float eps) -> Tensor", &norm<instance_norm_of>);
  m.def("instance_norm_backward(Tensor grad, Tensor input, float eps) -> Tensor", &norm_backward<instance_norm_of>);
  m.def("batch_statistics_norm(Tensor input, float eps) -> Tensor", &norm<batch_statistics_norm_of>);
  m.def("batch_statistics_norm_backward(Tensor grad, Tensor input, float eps) -> Tensor",
        &norm_backward<batch_statistics_norm_of>);
  GRADIENT_OVERLOADS(DEFINE_NORM_OVERLOAD)
  m.def("group_norm(Tensor input, int groups, float eps) -> Tensor", &group_norm);
  m.def("group_norm_backward(Tensor grad, Tensor input, int groups, float eps) -> Tensor", &group_norm_backward);
  m.def("embedding_bag(" EMBEDDING_BAG_ARGUMENTS ") -> Tensor", &embedding_bag);
  m.def("embedding_bag_backward(Tensor grad, " EMBEDDING_BAG_ARGUMENTS ") -> Tensor", &embedding_bag_backward);
}
