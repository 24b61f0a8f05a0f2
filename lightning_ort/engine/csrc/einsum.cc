// torch.einsum on torch's kernels (einsum.py), for the equations ORT's own export leaves as an ONNX
// Einsum node, which ORT 1.19.2 cannot differentiate. The equation travels as its character codes
// (ORT's ATen executor passes no strings); gradients are eager autograd's (autograd_vjp.h).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "autograd_vjp.h"

namespace {

std::string equation_of(at::IntArrayRef codes) {
  std::string equation;
  for (auto code : codes) equation.push_back(static_cast<char>(code));
  return equation;
}

at::Tensor einsum(const at::Tensor& self, at::IntArrayRef equation) { return at::einsum(equation_of(equation), {self}); }

at::Tensor einsum_backward(const at::Tensor& grad, const at::Tensor& self, at::IntArrayRef equation) {
  auto text = equation_of(equation);
  auto forward = [&text](const std::vector<at::Tensor>& inputs) { return at::einsum(text, {inputs[0]}); };
  return lightning_ort::vjp(forward, {self}, {true}, grad)[0];
}

at::Tensor einsum2(const at::Tensor& self, const at::Tensor& other, at::IntArrayRef equation) {
  return at::einsum(equation_of(equation), {self, other});
}

template <bool kSelf, bool kOther>
std::tuple<at::Tensor, at::Tensor> einsum2_backward(const at::Tensor& grad, const at::Tensor& self,
                                                    const at::Tensor& other, at::IntArrayRef equation) {
  auto text = equation_of(equation);
  auto forward = [&text](const std::vector<at::Tensor>& inputs) { return at::einsum(text, {inputs[0], inputs[1]}); };
  auto grads = lightning_ort::vjp(forward, {self, other}, {kSelf, kOther}, grad);
  return {grads[0], grads[1]};
}

}  // namespace

#define EINSUM2 "(Tensor self, Tensor other, int[] equation) -> Tensor"
#define EINSUM2_BACKWARD "(Tensor grad, Tensor self, Tensor other, int[] equation) -> (Tensor, Tensor)"

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("einsum(Tensor self, int[] equation) -> Tensor", &einsum);
  m.def("einsum_backward(Tensor grad, Tensor self, int[] equation) -> Tensor", &einsum_backward);
  m.def("einsum2" EINSUM2, &einsum2);
  m.def("einsum2.self" EINSUM2, &einsum2);
  m.def("einsum2.other" EINSUM2, &einsum2);
  m.def("einsum2_backward" EINSUM2_BACKWARD, &einsum2_backward<true, true>);
  m.def("einsum2_backward.self" EINSUM2_BACKWARD, &einsum2_backward<true, false>);
  m.def("einsum2_backward.other" EINSUM2_BACKWARD, &einsum2_backward<false, true>);
}
