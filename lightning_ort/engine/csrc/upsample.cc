// Upsampling (upsample.py): torch's kernels for every mode of F.interpolate, forward and backward,
// as eager autograd runs them. Scale factors come as a float64 tensor (scales.h): the nearest modes
// pick source pixels by floor(dst / scale), which 1.7 and 1.7f decide differently at some pixels.
// The gradients take the forward's scale factors, as eager's do: the
// kernels map coordinates by 1 / scale when a scale is given and by input size / output size
// otherwise, and the two differ when the scale is not the ratio of the sizes (1.7 on 9 pixels
// gives 15).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "scales.h"

namespace {

enum class Mode { kNearest, kNearestExact, kLinear, kBicubic };

using lightning_ort::as_ref;
using lightning_ort::scale;
using lightning_ort::to_scales;

template <Mode kMode>
at::Tensor upsample(const at::Tensor& input, at::OptionalIntArrayRef output_size, bool align_corners,
                    const c10::optional<at::Tensor>& scale_factors) {
  auto scales = to_scales(scale_factors);
  auto factors = as_ref(scales);
  auto dims = input.dim() - 2;
  if (kMode == Mode::kNearest) {
    if (dims == 1) return at::upsample_nearest1d(input, output_size, factors);
    if (dims == 2) return at::upsample_nearest2d(input, output_size, factors);
    if (dims == 3) return at::upsample_nearest3d(input, output_size, factors);
  } else if (kMode == Mode::kNearestExact) {
    if (dims == 1) return at::_upsample_nearest_exact1d(input, output_size, factors);
    if (dims == 2) return at::_upsample_nearest_exact2d(input, output_size, factors);
    if (dims == 3) return at::_upsample_nearest_exact3d(input, output_size, factors);
  } else if (kMode == Mode::kLinear) {
    if (dims == 1) return at::upsample_linear1d(input, output_size, align_corners, factors);
    if (dims == 2) return at::upsample_bilinear2d(input, output_size, align_corners, factors);
    if (dims == 3) return at::upsample_trilinear3d(input, output_size, align_corners, factors);
  } else if (dims == 2) {
    return at::upsample_bicubic2d(input, output_size, align_corners, factors);
  }
  TORCH_CHECK(false, "lightning_ort: no upsampling of this mode for a ", input.dim(), "-d tensor");
}

template <Mode kMode>
at::Tensor upsample_backward(const at::Tensor& grad, at::IntArrayRef input_size, bool align_corners,
                             const c10::optional<at::Tensor>& scale_factors) {
  auto s = to_scales(scale_factors);
  auto out = grad.sizes().slice(2).vec();
  auto dims = input_size.size() - 2;
  if (kMode == Mode::kNearest) {
    if (dims == 1) return at::upsample_nearest1d_backward(grad, out, input_size, scale(s, 0));
    if (dims == 2) return at::upsample_nearest2d_backward(grad, out, input_size, scale(s, 0), scale(s, 1));
    if (dims == 3)
      return at::upsample_nearest3d_backward(grad, out, input_size, scale(s, 0), scale(s, 1), scale(s, 2));
  } else if (kMode == Mode::kNearestExact) {
    if (dims == 1) return at::_upsample_nearest_exact1d_backward(grad, out, input_size, scale(s, 0));
    if (dims == 2) return at::_upsample_nearest_exact2d_backward(grad, out, input_size, scale(s, 0), scale(s, 1));
    if (dims == 3)
      return at::_upsample_nearest_exact3d_backward(grad, out, input_size, scale(s, 0), scale(s, 1), scale(s, 2));
  } else if (kMode == Mode::kLinear) {
    if (dims == 1) return at::upsample_linear1d_backward(grad, out, input_size, align_corners, scale(s, 0));
    if (dims == 2)
      return at::upsample_bilinear2d_backward(grad, out, input_size, align_corners, scale(s, 0), scale(s, 1));
    if (dims == 3)
      return at::upsample_trilinear3d_backward(grad, out, input_size, align_corners, scale(s, 0), scale(s, 1),
                                               scale(s, 2));
  } else if (dims == 2) {
    return at::upsample_bicubic2d_backward(grad, out, input_size, align_corners, scale(s, 0), scale(s, 1));
  }
  TORCH_CHECK(false, "lightning_ort: no upsampling gradient of this mode for a ", input_size.size(), "-d tensor");
}

// The nearest modes have no align_corners.
template <Mode kMode>
at::Tensor upsample_nearest(const at::Tensor& input, at::OptionalIntArrayRef output_size,
                            const c10::optional<at::Tensor>& scale_factors) {
  return upsample<kMode>(input, output_size, false, scale_factors);
}

template <Mode kMode>
at::Tensor upsample_nearest_backward(const at::Tensor& grad, at::IntArrayRef input_size,
                                     const c10::optional<at::Tensor>& scale_factors) {
  return upsample_backward<kMode>(grad, input_size, false, scale_factors);
}

}  // namespace

#define NEAREST "(Tensor input, int[]? output_size, Tensor? scale_factors) -> Tensor"
#define NEAREST_BACKWARD "(Tensor grad, int[] input_size, Tensor? scale_factors) -> Tensor"
#define INTERPOLATING "(Tensor input, int[]? output_size, bool align_corners, Tensor? scale_factors) -> Tensor"
#define INTERPOLATING_BACKWARD "(Tensor grad, int[] input_size, bool align_corners, Tensor? scale_factors) -> Tensor"

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("upsample_nearest" NEAREST, &upsample_nearest<Mode::kNearest>);
  m.def("upsample_nearest_backward" NEAREST_BACKWARD, &upsample_nearest_backward<Mode::kNearest>);
  m.def("upsample_nearest_exact" NEAREST, &upsample_nearest<Mode::kNearestExact>);
  m.def("upsample_nearest_exact_backward" NEAREST_BACKWARD, &upsample_nearest_backward<Mode::kNearestExact>);
  m.def("upsample_linear" INTERPOLATING, &upsample<Mode::kLinear>);
  m.def("upsample_linear_backward" INTERPOLATING_BACKWARD, &upsample_backward<Mode::kLinear>);
  m.def("upsample_bicubic" INTERPOLATING, &upsample<Mode::kBicubic>);
  m.def("upsample_bicubic_backward" INTERPOLATING_BACKWARD, &upsample_backward<Mode::kBicubic>);
}
