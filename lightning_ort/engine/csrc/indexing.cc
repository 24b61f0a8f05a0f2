// Indexing ops torch 2.13 cannot export to ONNX (indexing.py): torch.diff and torch.take_along_dim
// on torch's kernels, with eager autograd's own gradients (autograd_vjp.h).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "autograd_vjp.h"

namespace {

using lightning_ort::vjp;

// prepend and append are concatenated to `self` in the graph
at::Tensor diff(const at::Tensor& self, int64_t n, int64_t dim) { return at::diff(self, n, dim); }

at::Tensor diff_backward(const at::Tensor& grad, const at::Tensor& self, int64_t n, int64_t dim) {
  auto forward = [n, dim](const std::vector<at::Tensor>& inputs) { return at::diff(inputs[0], n, dim); };
  return vjp(forward, {self}, {true}, grad)[0];
}

at::Tensor take_along_dim(const at::Tensor& self, const at::Tensor& indices, int64_t dim) {
  return at::take_along_dim(self, indices, dim);
}

at::Tensor take_along_dim_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& indices,
                                   int64_t dim) {
  auto forward = [&indices, dim](const std::vector<at::Tensor>& inputs) {
    return at::take_along_dim(inputs[0], indices, dim);
  };
  return vjp(forward, {self}, {true}, grad)[0];
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("diff(Tensor self, int n, int dim) -> Tensor", &diff);
  m.def("diff_backward(Tensor grad, Tensor self, int n, int dim) -> Tensor", &diff_backward);
  m.def("take_along_dim(Tensor self, Tensor indices, int dim) -> Tensor", &take_along_dim);
  m.def("take_along_dim_backward(Tensor grad, Tensor self, Tensor indices, int dim) -> Tensor",
        &take_along_dim_backward);
}
