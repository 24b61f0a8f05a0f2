// nn.RNN on torch's kernels (rnn.py): ORT 1.19.2 has no gradient for ONNX's RNN. One node runs one
// layer in one direction, and its gradients are eager autograd's (autograd_vjp.h). rnn.py packs a
// layer's weights and biases into one tensor, so a node has three inputs that may need gradients,
// with one overload per set that does.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "autograd_vjp.h"

namespace {

// input: (time, batch, features); hx: (batch, hidden); weights: w_ih, w_hh (and b_ih, b_hh) flattened
// and concatenated. The output sequence, (time, batch, hidden), in the input's time order also when
// the layer runs backwards in time.
at::Tensor rnn_layer_of(const at::Tensor& input, const at::Tensor& hx, const at::Tensor& weights, bool has_biases,
                        bool relu, bool reverse) {
  const int64_t hidden = hx.size(-1);
  const int64_t features = input.size(-1);
  std::vector<at::Tensor> params = {
      weights.narrow(0, 0, hidden * features).view({hidden, features}),
      weights.narrow(0, hidden * features, hidden * hidden).view({hidden, hidden}),
  };
  if (has_biases) {
    const int64_t offset = hidden * (features + hidden);
    params.push_back(weights.narrow(0, offset, hidden));
    params.push_back(weights.narrow(0, offset + hidden, hidden));
  }
  auto sequence = reverse ? input.flip(0) : input;
  auto state = hx.unsqueeze(0);
  auto output = std::get<0>(
      relu ? at::rnn_relu(sequence, state, params, has_biases, /*num_layers=*/1, /*dropout=*/0.0, /*train=*/false,
                          /*bidirectional=*/false, /*batch_first=*/false)
           : at::rnn_tanh(sequence, state, params, has_biases, 1, 0.0, false, false, false));
  return reverse ? output.flip(0) : output;
}

at::Tensor rnn_layer(const at::Tensor& input, const at::Tensor& hx, const at::Tensor& weights, bool has_biases,
                     bool relu, bool reverse) {
  return rnn_layer_of(input, hx, weights, has_biases, relu, reverse);
}

template <bool kInput, bool kHx, bool kWeights>
std::tuple<at::Tensor, at::Tensor, at::Tensor> rnn_layer_backward(const at::Tensor& grad, const at::Tensor& input,
                                                                  const at::Tensor& hx, const at::Tensor& weights,
                                                                  bool has_biases, bool relu, bool reverse) {
  auto forward = [=](const std::vector<at::Tensor>& inputs) {
    return rnn_layer_of(inputs[0], inputs[1], inputs[2], has_biases, relu, reverse);
  };
  auto grads = lightning_ort::vjp(forward, {input, hx, weights}, {kInput, kHx, kWeights}, grad);
  return {grads[0], grads[1], grads[2]};
}

}  // namespace

#define RNN_LAYER "(Tensor input, Tensor hx, Tensor weights, bool has_biases, bool relu, bool reverse) -> Tensor"
#define RNN_LAYER_BACKWARD                                                                                    \
  "(Tensor grad, Tensor input, Tensor hx, Tensor weights, bool has_biases, bool relu, bool reverse) -> " \
  "(Tensor, Tensor, Tensor)"
// gradient_overloads.overload_name of slots ("input", "hx", "weights")
#define RNN_OVERLOADS(DEF)                 \
  DEF("", true, true, true)                \
  DEF(".input_hx", true, true, false)      \
  DEF(".input_weights", true, false, true) \
  DEF(".hx_weights", false, true, true)    \
  DEF(".input", true, false, false)        \
  DEF(".hx", false, true, false)           \
  DEF(".weights", false, false, true)
#define DEFINE_RNN_OVERLOAD(overload, input, hx, weights)     \
  m.def("rnn_layer" overload RNN_LAYER, &rnn_layer);           \
  m.def("rnn_layer_backward" overload RNN_LAYER_BACKWARD, &rnn_layer_backward<input, hx, weights>);

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) { RNN_OVERLOADS(DEFINE_RNN_OVERLOAD) }
