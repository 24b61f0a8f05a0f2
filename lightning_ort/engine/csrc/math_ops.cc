// Math functions torch cannot export to ONNX or ORT 1.19.2 cannot differentiate (math_ops.py):
// torch's kernels forward, eager autograd's formulas backward. ORT's executor passes float
// arguments as float32, torch's Scalars not at all, hence the wrappers.

#include <ATen/ATen.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "autograd_vjp.h"

namespace {

at::Tensor atan_backward(const at::Tensor& grad, const at::Tensor& self) { return grad / (self * self + 1); }

at::Tensor expm1_backward(const at::Tensor& grad, const at::Tensor& result) { return grad * (result + 1); }

at::Tensor threshold(const at::Tensor& self, double threshold, double value) {
  return at::threshold(self, threshold, value);
}

at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self, double threshold) {
  return at::threshold_backward(grad, self, threshold);
}

at::Tensor logsumexp_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& result,
                              at::IntArrayRef dim, bool keepdim) {
  auto expanded_grad = grad;
  auto expanded_result = result;
  if (!keepdim && self.dim() != 0) {  // put the reduced dimensions back, as eager's formula does
    auto reduced = at::dim_list_to_bitset(dim, self.dim());
    for (int64_t i = 0; i < self.dim(); ++i) {
      if (reduced[i]) {
        expanded_grad = expanded_grad.unsqueeze(i);
        expanded_result = expanded_result.unsqueeze(i);
      }
    }
  }
  return expanded_grad * (self - expanded_result).exp();
}

at::Tensor zeros_like(const at::Tensor& grad) { return at::zeros_like(grad); }

at::Tensor cumprod(const at::Tensor& self, int64_t dim) { return at::cumprod(self, dim); }

at::Tensor cumprod_backward(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  auto forward = [dim](const std::vector<at::Tensor>& inputs) { return at::cumprod(inputs[0], dim); };
  return lightning_ort::vjp(forward, {self}, {true}, grad)[0];
}

at::Tensor logcumsumexp_backward(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  auto forward = [dim](const std::vector<at::Tensor>& inputs) { return at::logcumsumexp(inputs[0], dim); };
  return lightning_ort::vjp(forward, {self}, {true}, grad)[0];
}

// A power whose exponent is a tensor: ORT 1.19.2 stops the gradient at Pow's exponent
at::Tensor tensor_pow(const at::Tensor& self, const at::Tensor& exponent) { return at::pow(self, exponent); }

template <bool kSelf, bool kExponent>
std::tuple<at::Tensor, at::Tensor> tensor_pow_backward(const at::Tensor& grad, const at::Tensor& self,
                                                const at::Tensor& exponent) {
  auto forward = [](const std::vector<at::Tensor>& inputs) { return at::pow(inputs[0], inputs[1]); };
  auto grads = lightning_ort::vjp(forward, {self, exponent}, {kSelf, kExponent}, grad);
  return {grads[0], grads[1]};
}

}  // namespace

#define POW "(Tensor self, Tensor exponent) -> Tensor"
#define POW_BACKWARD "(Tensor grad, Tensor self, Tensor exponent) -> (Tensor, Tensor)"

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("pow" POW, &tensor_pow);
  m.def("pow_backward" POW_BACKWARD, &tensor_pow_backward<true, true>);
  m.def("pow.self" POW, &tensor_pow);
  m.def("pow_backward.self" POW_BACKWARD, &tensor_pow_backward<true, false>);
  m.def("pow.exponent" POW, &tensor_pow);
  m.def("pow_backward.exponent" POW_BACKWARD, &tensor_pow_backward<false, true>);
  m.def("atan_backward(Tensor grad, Tensor self) -> Tensor", &atan_backward);
  m.def("expm1_backward(Tensor grad, Tensor result) -> Tensor", &expm1_backward);
  m.def("threshold(Tensor self, float threshold, float value) -> Tensor", &threshold);
  m.def("threshold_backward(Tensor grad, Tensor self, float threshold) -> Tensor", &threshold_backward);
  m.def("logsumexp_backward(Tensor grad, Tensor self, Tensor result, int[] dim, bool keepdim) -> Tensor",
        &logsumexp_backward);
  m.def("zeros_like(Tensor grad) -> Tensor", &zeros_like);
  m.def("cumprod(Tensor self, int dim) -> Tensor", &cumprod);
  m.def("cumprod_backward(Tensor grad, Tensor self, int dim) -> Tensor", &cumprod_backward);
  m.def("logcumsumexp_backward(Tensor grad, Tensor self, int dim) -> Tensor", &logcumsumexp_backward);
}
