// Upsampling scale factors handed over as a float64 tensor (upsample.py): ORT's ATen executor reads
// float arguments as float32, which would change the nearest modes' choice of source pixels.

#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace lightning_ort {

using Scales = c10::optional<std::vector<double>>;

inline Scales to_scales(const c10::optional<at::Tensor>& scale_factors) {
  if (!scale_factors.has_value() || !scale_factors->defined()) return c10::nullopt;
  auto values = scale_factors->to(at::kDouble).contiguous();
  return std::vector<double>(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
}

inline c10::optional<at::ArrayRef<double>> as_ref(const Scales& scales) {
  if (!scales.has_value()) return c10::nullopt;
  return at::ArrayRef<double>(*scales);
}

inline c10::optional<double> scale(const Scales& scales, size_t dim) {
  if (!scales.has_value() || dim >= scales->size()) return c10::nullopt;
  return (*scales)[dim];
}

}  // namespace lightning_ort
