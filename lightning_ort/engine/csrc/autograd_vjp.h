// Gradients by eager autograd itself, for operators whose backward formulas torch keeps private
// (cumprod, PReLU, the normalizations, some poolings and reductions): the forward runs again on the
// saved inputs with autograd on, and torch::autograd::grad returns exactly what eager's backward
// would.

#pragma once

#include <Python.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <vector>

namespace lightning_ort {

using Forward = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// torch's autograd engine refuses to run while the calling thread holds Python's GIL, which it does
// when ORT runs a backward pass from Python; released for the scope, if held.
class GilReleased {
 public:
  GilReleased() : state_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~GilReleased() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_;
};

// The gradients of `inputs` (those `needed`) given the gradient of `forward(inputs)`. An input not
// needed or absent gets an undefined gradient, a needed one the output does not depend on zeros.
inline std::vector<at::Tensor> vjp(const Forward& forward, const std::vector<at::Tensor>& inputs,
                                   const std::vector<bool>& needed, const at::Tensor& grad) {
  at::AutoGradMode enable(true);
  std::vector<at::Tensor> leaves;
  std::vector<at::Tensor> with_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      leaves.push_back(inputs[i]);
      continue;
    }
    auto leaf = inputs[i].detach();
    if (needed[i]) {
      leaf.requires_grad_(true);
      with_grad.push_back(leaf);
    }
    leaves.push_back(leaf);
  }
  std::vector<at::Tensor> grads(inputs.size());
  if (with_grad.empty()) return grads;
  auto output = forward(leaves);
  GilReleased released;
  auto computed = torch::autograd::grad({output}, with_grad, {grad}, false, false, true);
  size_t next = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !needed[i]) continue;
    auto& computed_grad = computed[next++];
    // torch returns some zero gradients (sgn's, sign's) as ZeroTensors, which own no memory
    grads[i] = computed_grad.defined() && !computed_grad._is_zerotensor() ? computed_grad : at::zeros_like(inputs[i]);
  }
  return grads;
}

}  // namespace lightning_ort
