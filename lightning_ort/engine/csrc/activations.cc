// Activations whose ONNX forms ORT 1.19.2 has no gradient for (HardSwish, HardSigmoid, Softplus and
// so Mish, Elu, Selu, Celu; activations.py): torch's own kernels, forward and backward, as eager
// autograd runs them. ORT's executor passes float arguments as float32, torch's Scalars not at all.

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

// selu's constants, as torch's
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;

at::Tensor hardswish(const at::Tensor& self) { return at::hardswish(self); }
at::Tensor hardswish_backward(const at::Tensor& grad, const at::Tensor& self) {
  return at::hardswish_backward(grad, self);
}
at::Tensor hardsigmoid(const at::Tensor& self) { return at::hardsigmoid(self); }
at::Tensor hardsigmoid_backward(const at::Tensor& grad, const at::Tensor& self) {
  return at::hardsigmoid_backward(grad, self);
}
at::Tensor mish(const at::Tensor& self) { return at::mish(self); }
at::Tensor mish_backward(const at::Tensor& grad, const at::Tensor& self) { return at::mish_backward(grad, self); }
at::Tensor softplus(const at::Tensor& self, double beta, double threshold) {
  return at::softplus(self, beta, threshold);
}
at::Tensor softplus_backward(const at::Tensor& grad, const at::Tensor& self, double beta, double threshold) {
  return at::softplus_backward(grad, self, beta, threshold);
}
// elu covers celu (alpha, 1, 1 / alpha) too, as torch's celu does
at::Tensor elu(const at::Tensor& self, double alpha, double scale, double input_scale) {
  return at::elu(self, alpha, scale, input_scale);
}
at::Tensor elu_backward(const at::Tensor& grad, const at::Tensor& self, double alpha, double scale,
                        double input_scale) {
  return at::elu_backward(grad, alpha, scale, input_scale, false, self);
}
at::Tensor selu(const at::Tensor& self) { return at::elu(self, kSeluAlpha, kSeluScale, 1.0); }
at::Tensor selu_backward(const at::Tensor& grad, const at::Tensor& self) {
  return at::elu_backward(grad, kSeluAlpha, kSeluScale, 1.0, false, self);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("hardswish(Tensor self) -> Tensor", &hardswish);
  m.def("hardswish_backward(Tensor grad, Tensor self) -> Tensor", &hardswish_backward);
  m.def("hardsigmoid(Tensor self) -> Tensor", &hardsigmoid);
  m.def("hardsigmoid_backward(Tensor grad, Tensor self) -> Tensor", &hardsigmoid_backward);
  m.def("mish(Tensor self) -> Tensor", &mish);
  m.def("mish_backward(Tensor grad, Tensor self) -> Tensor", &mish_backward);
  m.def("softplus(Tensor self, float beta, float threshold) -> Tensor", &softplus);
  m.def("softplus_backward(Tensor grad, Tensor self, float beta, float threshold) -> Tensor", &softplus_backward);
  m.def("elu(Tensor self, float alpha, float scale, float input_scale) -> Tensor", &elu);
  m.def("elu_backward(Tensor grad, Tensor self, float alpha, float scale, float input_scale) -> Tensor", &elu_backward);
  m.def("selu(Tensor self) -> Tensor", &selu);
  m.def("selu_backward(Tensor grad, Tensor self) -> Tensor", &selu_backward);
}
