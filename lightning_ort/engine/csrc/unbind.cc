// The q/k/v split of attention in one pass each way (unbind.py): `x.permute(perm).unbind(dim)`, each
// part copied by torch's parallel copy, replaces ORT's Split with a Transpose per part;
// its gradient writes the parts' gradients straight into the input's layout, replacing ORT's
// Concat and Transpose. Values are copies either way, identical to eager's.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace {

// Always copies: ORT takes the outputs over without knowing they could share the input's memory, and
// reuses that memory after the node. contiguous() returns a view when the part is contiguous
// already: always for a split of the first dimension (torch's own packed in-projection, as with
// add_bias_kv), otherwise when every other dimension has size 1 (one sequence of length 1).
std::vector<at::Tensor> parts(const at::Tensor& x, at::IntArrayRef perm, int64_t dim) {
  std::vector<at::Tensor> result;
  for (const auto& part : x.permute(perm).unbind(dim)) result.push_back(part.clone(at::MemoryFormat::Contiguous));
  return result;
}

std::tuple<at::Tensor, at::Tensor> unbind2(const at::Tensor& x, at::IntArrayRef perm, int64_t dim) {
  auto p = parts(x, perm, dim);
  TORCH_CHECK(p.size() == 2, "lightning_ort::unbind2 of a dimension of size ", p.size());
  return {p[0], p[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unbind3(const at::Tensor& x, at::IntArrayRef perm, int64_t dim) {
  auto p = parts(x, perm, dim);
  TORCH_CHECK(p.size() == 3, "lightning_ort::unbind3 of a dimension of size ", p.size());
  return {p[0], p[1], p[2]};
}

// The input's gradient from its parts' (undefined where ORT has none: zeros). `part` is any forward
// output, for the parts' shape and type.
at::Tensor unbind_backward(at::ArrayRef<c10::optional<at::Tensor>> grads, const at::Tensor& part, at::IntArrayRef perm,
                           int64_t dim) {
  auto permuted_sizes = part.sizes().vec();
  permuted_sizes.insert(permuted_sizes.begin() + dim, static_cast<int64_t>(grads.size()));
  std::vector<int64_t> sizes(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) sizes[perm[i]] = permuted_sizes[i];
  auto grad = at::empty(sizes, part.options());
  auto permuted = grad.permute(perm);
  for (size_t i = 0; i < grads.size(); ++i) {
    auto slot = permuted.select(dim, static_cast<int64_t>(i));
    if (grads[i].has_value() && grads[i]->defined()) {
      slot.copy_(*grads[i]);
    } else {
      slot.zero_();
    }
  }
  return grad;
}

at::Tensor unbind2_backward(const c10::optional<at::Tensor>& grad0, const c10::optional<at::Tensor>& grad1,
                            const at::Tensor& part, at::IntArrayRef perm, int64_t dim) {
  return unbind_backward({grad0, grad1}, part, perm, dim);
}

at::Tensor unbind3_backward(const c10::optional<at::Tensor>& grad0, const c10::optional<at::Tensor>& grad1,
                            const c10::optional<at::Tensor>& grad2, const at::Tensor& part, at::IntArrayRef perm,
                            int64_t dim) {
  return unbind_backward({grad0, grad1, grad2}, part, perm, dim);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("unbind2(Tensor x, int[] perm, int dim) -> (Tensor, Tensor)", &unbind2);
  m.def("unbind3(Tensor x, int[] perm, int dim) -> (Tensor, Tensor, Tensor)", &unbind3);
  m.def("unbind2_backward(Tensor? grad0, Tensor? grad1, Tensor part, int[] perm, int dim) -> Tensor",
        &unbind2_backward);
  m.def("unbind3_backward(Tensor? grad0, Tensor? grad1, Tensor? grad2, Tensor part, int[] perm, int dim) -> Tensor",
        &unbind3_backward);
}
