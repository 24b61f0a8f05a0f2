// Element-wise functions torch 2.13 cannot export to ONNX (special_functions.py): lgamma, digamma,
// erfinv and kin (torch.distributions' log-probabilities), atan2, xlogy, logaddexp and kin. Forward,
// torch's kernels; backward, eager autograd itself (autograd_vjp.h).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "autograd_vjp.h"

namespace {

using lightning_ort::vjp;

template <at::Tensor (*kFunction)(const at::Tensor&)>
at::Tensor unary_backward(const at::Tensor& grad, const at::Tensor& self) {
  auto forward = [](const std::vector<at::Tensor>& inputs) { return kFunction(inputs[0]); };
  return vjp(forward, {self}, {true}, grad)[0];
}

// Functions with an integer parameter: polygamma's order, mvlgamma's dimension
at::Tensor polygamma(const at::Tensor& self, int64_t n) { return at::polygamma(n, self); }

at::Tensor polygamma_backward(const at::Tensor& grad, const at::Tensor& self, int64_t n) {
  auto forward = [n](const std::vector<at::Tensor>& inputs) { return at::polygamma(n, inputs[0]); };
  return vjp(forward, {self}, {true}, grad)[0];
}

at::Tensor mvlgamma(const at::Tensor& self, int64_t p) { return at::mvlgamma(self, p); }

at::Tensor mvlgamma_backward(const at::Tensor& grad, const at::Tensor& self, int64_t p) {
  auto forward = [p](const std::vector<at::Tensor>& inputs) { return at::mvlgamma(inputs[0], p); };
  return vjp(forward, {self}, {true}, grad)[0];
}

// Two tensors that broadcast; one overload per set of gradients a node needs (gradient_overloads.py)
template <at::Tensor (*kFunction)(const at::Tensor&, const at::Tensor&), bool kSelf, bool kOther>
std::tuple<at::Tensor, at::Tensor> binary_backward(const at::Tensor& grad, const at::Tensor& self,
                                                   const at::Tensor& other) {
  auto forward = [](const std::vector<at::Tensor>& inputs) { return kFunction(inputs[0], inputs[1]); };
  auto grads = vjp(forward, {self, other}, {kSelf, kOther}, grad);
  return {grads[0], grads[1]};
}

// X-macros: (lightning_ort's name, torch's function)
#define UNARY_FUNCTIONS(X)                  \
  X(lgamma, at::lgamma)                     \
  X(digamma, at::digamma)                   \
  X(erfinv, at::erfinv)                     \
  X(erfc, at::erfc)                         \
  X(exp2, at::exp2)                         \
  X(sinc, at::sinc)                         \
  X(frac, at::frac)                         \
  X(deg2rad, at::deg2rad)                   \
  X(rad2deg, at::rad2deg)                   \
  X(sgn, at::sgn)                           \
  X(i0, at::i0)                             \
  X(asinh, at::asinh)                       \
  X(acosh, at::acosh)                       \
  X(atanh, at::atanh)                       \
  X(special_i0e, at::special_i0e)           \
  X(special_i1, at::special_i1)             \
  X(special_i1e, at::special_i1e)           \
  X(special_ndtr, at::special_ndtr)         \
  X(special_ndtri, at::special_ndtri)       \
  X(special_log_ndtr, at::special_log_ndtr) \
  X(special_entr, at::special_entr)         \
  X(special_erfcx, at::special_erfcx)

#define BINARY_FUNCTIONS(X)          \
  X(atan2, at::atan2)                \
  X(hypot, at::hypot)                \
  X(copysign, at::copysign)          \
  X(xlogy, at::xlogy)                \
  X(xlog1py, at::special_xlog1py)    \
  X(logaddexp, at::logaddexp)        \
  X(logaddexp2, at::logaddexp2)      \
  X(fmod, at::fmod)                  \
  X(remainder, at::remainder)        \
  X(float_power, at::float_power)

// Named functions of tensors only (torch's are overloaded for Scalars)
#define DEFINE_UNARY(name, function) \
  at::Tensor name##_function(const at::Tensor& self) { return function(self); }
#define DEFINE_BINARY(name, function) \
  at::Tensor name##_function(const at::Tensor& self, const at::Tensor& other) { return function(self, other); }
UNARY_FUNCTIONS(DEFINE_UNARY)
BINARY_FUNCTIONS(DEFINE_BINARY)

}  // namespace

#define UNARY(name, function)                                 \
  m.def(#name "(Tensor self) -> Tensor", &name##_function); \
  m.def(#name "_backward(Tensor grad, Tensor self) -> Tensor", &unary_backward<&name##_function>);

#define BINARY_OVERLOAD(name, overload, self, other)                                                   \
  m.def(#name overload "(Tensor self, Tensor other) -> Tensor", &name##_function);                   \
  m.def(#name "_backward" overload "(Tensor grad, Tensor self, Tensor other) -> (Tensor, Tensor)", \
        &binary_backward<&name##_function, self, other>);

#define BINARY(name, function)                    \
  BINARY_OVERLOAD(name, "", true, true)           \
  BINARY_OVERLOAD(name, ".self", true, false)     \
  BINARY_OVERLOAD(name, ".other", false, true)

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  UNARY_FUNCTIONS(UNARY)
  BINARY_FUNCTIONS(BINARY)
  m.def("polygamma(Tensor self, int n) -> Tensor", &polygamma);
  m.def("polygamma_backward(Tensor grad, Tensor self, int n) -> Tensor", &polygamma_backward);
  m.def("mvlgamma(Tensor self, int p) -> Tensor", &mvlgamma);
  m.def("mvlgamma_backward(Tensor grad, Tensor self, int p) -> Tensor", &mvlgamma_backward);
}
