// Reductions ORT 1.19.2 cannot differentiate or torch cannot export (reductions.py): vector norms,
// prod, amax, amin, nansum, nanmean and std on torch's kernels, with eager autograd's own gradients (autograd_vjp.h): norms masked where they
// are 0, prod exact with zeros among the factors, amax/amin split evenly among ties.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "autograd_vjp.h"

namespace {

using lightning_ort::vjp;

// An empty `dim` stands for None (every dimension). `ord` comes as a float64 tensor: ORT's executor
// passes float arguments as float32, which would round an order such as 1.5 or 0.1.
at::Tensor vector_norm(const at::Tensor& self, const at::Tensor& ord, at::IntArrayRef dim, bool keepdim) {
  auto dims = dim.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dim);
  return at::linalg_vector_norm(self, ord.item<double>(), dims, keepdim);
}

at::Tensor vector_norm_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& ord,
                                at::IntArrayRef dim, bool keepdim) {
  std::vector<int64_t> dims(dim.begin(), dim.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) { return vector_norm(inputs[0], ord, dims, keepdim); };
  return vjp(forward, {self}, {true}, grad)[0];
}

// `dim`: empty for torch.prod(x), one dimension for torch.prod(x, dim)
at::Tensor prod(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  return dim.empty() ? at::prod(self) : at::prod(self, dim[0], keepdim);
}

at::Tensor prod_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  std::vector<int64_t> dims(dim.begin(), dim.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) { return prod(inputs[0], dims, keepdim); };
  return vjp(forward, {self}, {true}, grad)[0];
}

at::Tensor amax_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  std::vector<int64_t> dims(dim.begin(), dim.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) { return at::amax(inputs[0], dims, keepdim); };
  return vjp(forward, {self}, {true}, grad)[0];
}

at::Tensor amin_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  std::vector<int64_t> dims(dim.begin(), dim.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) { return at::amin(inputs[0], dims, keepdim); };
  return vjp(forward, {self}, {true}, grad)[0];
}

// nansum / nanmean: an empty `dim` stands for None (every dimension)
at::Tensor nansum(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  return at::nansum(self, dim.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dim), keepdim);
}

at::Tensor nanmean(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  return at::nanmean(self, dim.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dim), keepdim);
}

template <at::Tensor (*kReduction)(const at::Tensor&, at::IntArrayRef, bool)>
at::Tensor nan_reduction_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef dim,
                                  bool keepdim) {
  std::vector<int64_t> dims(dim.begin(), dim.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) { return kReduction(inputs[0], dims, keepdim); };
  return vjp(forward, {self}, {true}, grad)[0];
}

// std: eager's gradient is 0 where the deviation is (a constant row); ORT's of Sqrt(var) was NaN there
at::Tensor standard_deviation(const at::Tensor& self, at::IntArrayRef dim, double correction, bool keepdim) {
  return at::std(self, dim.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dim), at::Scalar(correction),
                 keepdim);
}

at::Tensor standard_deviation_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef dim,
                                       double correction, bool keepdim) {
  std::vector<int64_t> dims(dim.begin(), dim.end());
  auto forward = [&](const std::vector<at::Tensor>& inputs) {
    return standard_deviation(inputs[0], dims, correction, keepdim);
  };
  return vjp(forward, {self}, {true}, grad)[0];
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("vector_norm(Tensor self, Tensor ord, int[] dim, bool keepdim) -> Tensor", &vector_norm);
  m.def("vector_norm_backward(Tensor grad, Tensor self, Tensor ord, int[] dim, bool keepdim) -> Tensor",
        &vector_norm_backward);
  m.def("prod(Tensor self, int[] dim, bool keepdim) -> Tensor", &prod);
  m.def("prod_backward(Tensor grad, Tensor self, int[] dim, bool keepdim) -> Tensor", &prod_backward);
  m.def("amax_backward(Tensor grad, Tensor self, int[] dim, bool keepdim) -> Tensor", &amax_backward);
  m.def("nansum(Tensor self, int[] dim, bool keepdim) -> Tensor", &nansum);
  m.def("nansum_backward(Tensor grad, Tensor self, int[] dim, bool keepdim) -> Tensor",
        &nan_reduction_backward<&nansum>);
  m.def("nanmean(Tensor self, int[] dim, bool keepdim) -> Tensor", &nanmean);
  m.def("nanmean_backward(Tensor grad, Tensor self, int[] dim, bool keepdim) -> Tensor",
        &nan_reduction_backward<&nanmean>);
  m.def("std(Tensor self, int[] dim, float correction, bool keepdim) -> Tensor", &standard_deviation);
  m.def("std_backward(Tensor grad, Tensor self, int[] dim, float correction, bool keepdim) -> Tensor",
        &standard_deviation_backward);
  m.def("amin_backward(Tensor grad, Tensor self, int[] dim, bool keepdim) -> Tensor", &amin_backward);
}
