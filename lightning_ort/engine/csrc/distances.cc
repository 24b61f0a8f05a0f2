// Distances torch exports as formulas ORT computes wrongly (distances.py): torch.cdist,
// F.pairwise_distance and F.cosine_similarity on torch's kernels, with eager autograd's own
// gradients (autograd_vjp.h: zero at a zero distance, finite at a zero vector, as in eager). One
// overload per set of gradients a node needs (gradient_overloads.py): the plain name needs both,
// `.x1` and `.x2` one.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "autograd_vjp.h"

namespace {

using lightning_ort::vjp;
using Pair = std::tuple<at::Tensor, at::Tensor>;

// compute_mode as torch's cdist takes it; -1 stands for none given
at::Tensor cdist(const at::Tensor& x1, const at::Tensor& x2, double p, int64_t compute_mode) {
  auto mode = compute_mode < 0 ? c10::nullopt : c10::optional<int64_t>(compute_mode);
  return at::cdist(x1, x2, p, mode);
}

template <bool kX1, bool kX2>
Pair cdist_backward(const at::Tensor& grad, const at::Tensor& x1, const at::Tensor& x2, double p,
                    int64_t compute_mode) {
  auto forward = [p, compute_mode](const std::vector<at::Tensor>& inputs) {
    return cdist(inputs[0], inputs[1], p, compute_mode);
  };
  auto grads = vjp(forward, {x1, x2}, {kX1, kX2}, grad);
  return {grads[0], grads[1]};
}

at::Tensor pairwise_distance(const at::Tensor& x1, const at::Tensor& x2, double p, double eps, bool keepdim) {
  return at::pairwise_distance(x1, x2, p, eps, keepdim);
}

template <bool kX1, bool kX2>
Pair pairwise_distance_backward(const at::Tensor& grad, const at::Tensor& x1, const at::Tensor& x2, double p,
                                double eps, bool keepdim) {
  auto forward = [p, eps, keepdim](const std::vector<at::Tensor>& inputs) {
    return at::pairwise_distance(inputs[0], inputs[1], p, eps, keepdim);
  };
  auto grads = vjp(forward, {x1, x2}, {kX1, kX2}, grad);
  return {grads[0], grads[1]};
}

at::Tensor cosine_similarity(const at::Tensor& x1, const at::Tensor& x2, int64_t dim, double eps) {
  return at::cosine_similarity(x1, x2, dim, eps);
}

template <bool kX1, bool kX2>
Pair cosine_similarity_backward(const at::Tensor& grad, const at::Tensor& x1, const at::Tensor& x2, int64_t dim,
                                double eps) {
  auto forward = [dim, eps](const std::vector<at::Tensor>& inputs) {
    return at::cosine_similarity(inputs[0], inputs[1], dim, eps);
  };
  auto grads = vjp(forward, {x1, x2}, {kX1, kX2}, grad);
  return {grads[0], grads[1]};
}

}  // namespace

#define CDIST "(Tensor x1, Tensor x2, float p, int compute_mode) -> Tensor"
#define CDIST_BACKWARD "(Tensor grad, Tensor x1, Tensor x2, float p, int compute_mode) -> (Tensor, Tensor)"
#define PAIRWISE "(Tensor x1, Tensor x2, float p, float eps, bool keepdim) -> Tensor"
#define PAIRWISE_BACKWARD \
  "(Tensor grad, Tensor x1, Tensor x2, float p, float eps, bool keepdim) -> (Tensor, Tensor)"
#define COSINE "(Tensor x1, Tensor x2, int dim, float eps) -> Tensor"
#define COSINE_BACKWARD "(Tensor grad, Tensor x1, Tensor x2, int dim, float eps) -> (Tensor, Tensor)"
#define DEFINE_DISTANCE_OVERLOAD(overload, x1, x2)                                                       \
  m.def("cdist" overload CDIST, &cdist);                                                                 \
  m.def("cdist_backward" overload CDIST_BACKWARD, &cdist_backward<x1, x2>);                             \
  m.def("pairwise_distance" overload PAIRWISE, &pairwise_distance);                                      \
  m.def("pairwise_distance_backward" overload PAIRWISE_BACKWARD, &pairwise_distance_backward<x1, x2>); \
  m.def("cosine_similarity" overload COSINE, &cosine_similarity);                                        \
  m.def("cosine_similarity_backward" overload COSINE_BACKWARD, &cosine_similarity_backward<x1, x2>);

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  DEFINE_DISTANCE_OVERLOAD("", true, true)
  DEFINE_DISTANCE_OVERLOAD(".x1", true, false)
  DEFINE_DISTANCE_OVERLOAD(".x2", false, true)
}
