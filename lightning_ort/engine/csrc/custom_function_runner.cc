// Runners for custom torch.autograd.Functions inside ONNX Runtime graphs (ORT's PythonOp and
// PythonOpGrad kernels), built by lightning_ort against the installed torch.
//
// ORT calls the two runners through function pointers registered with
// onnxruntime.capi._pybind_state.register_forward_runner / register_backward_runner, with this
// exact C++ signature (ORT's CustomFunctionRunnerType). Tensor arguments arrive as DLPack capsules
// owned by ORT; the runner must return new references: the autograd context first (forward only),
// then one DLPack capsule (or None) per output, each capsule referenced only by the returned vector.
//
// The work itself is done by Python "drivers" (lightning_ort/engine/bootstrap/custom_function.py) that use
// torch's public autograd API, so this file does not depend on autograd's internal ownership model
// (which changed in torch 2.13). The only internal field read is THPFunction::materialize_grads,
// which Python cannot read. It includes pybind11 itself, not torch/extension.h (all of libtorch's C++
// frontend, which took most of its compile time): no tensor crosses pybind11 here.

#include <torch/csrc/autograd/python_function.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Python callables set once by set_drivers(); intentionally never released (they live as long as
// the process, and releasing them during interpreter shutdown would need the GIL).
PyObject* forward_driver = nullptr;
PyObject* backward_driver = nullptr;

py::list as_list(const std::vector<int64_t>& values) {
  py::list result(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    result[i] = py::int_(values[i]);
  }
  return result;
}

std::vector<PyObject*> run_driver(PyObject* driver,
                                  const char* stage,
                                  const char* func_name,
                                  void* callback,
                                  const std::vector<int64_t>& requires_grad_flags,
                                  const std::vector<int64_t>& tensor_flags,
                                  bool is_training_mode,
                                  const std::vector<int64_t>& inplace_map,
                                  bool safe_run_mode,
                                  const std::vector<PyObject*>& args) {
  std::vector<PyObject*> results;
  std::string error;
  {
    py::gil_scoped_acquire gil;
    try {
      if (driver == nullptr) {
        throw std::runtime_error("the Python drivers were not registered (lightning_ort was not set up)");
      }
      py::list call_args(args.size());
      for (size_t i = 0; i < args.size(); ++i) {
        call_args[i] = py::reinterpret_borrow<py::object>(args[i] != nullptr ? args[i] : Py_None);
      }
      py::object returned = py::reinterpret_borrow<py::object>(driver)(
          py::reinterpret_borrow<py::object>(static_cast<PyObject*>(callback)),
          py::str(func_name),
          call_args,
          as_list(tensor_flags),
          as_list(requires_grad_flags),
          py::bool_(is_training_mode),
          as_list(inplace_map),
          py::bool_(safe_run_mode));
      if (!PyList_Check(returned.ptr())) {
        throw std::runtime_error("the Python driver did not return a list");
      }
      const Py_ssize_t count = PyList_GET_SIZE(returned.ptr());
      results.reserve(static_cast<size_t>(count));
      for (Py_ssize_t i = 0; i < count; ++i) {
        PyObject* item = PyList_GET_ITEM(returned.ptr(), i);
        Py_INCREF(item);
        results.push_back(item);
      }
      // `returned` is released here, leaving each capsule referenced once, by `results`.
    } catch (py::error_already_set& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty()) {
      for (PyObject* item : results) {
        Py_DECREF(item);
      }
      results.clear();
    }
  }
  if (!error.empty()) {
    throw std::runtime_error(std::string("lightning_ort: the ") + stage + " of custom autograd.Function " + func_name +
                             " failed inside ORT: " + error);
  }
  return results;
}

std::vector<PyObject*> forward_runner(const char* func_name,
                                      void* callback,
                                      const std::vector<int64_t>& requires_grad_flags,
                                      const std::vector<int64_t>& tensor_flags,
                                      const bool is_training_mode,
                                      const std::vector<int64_t>& inplace_map,
                                      const char* /*kernel_invoke_id*/,
                                      const bool safe_run_mode,
                                      const std::vector<PyObject*>& args) {
  return run_driver(forward_driver, "forward", func_name, callback, requires_grad_flags, tensor_flags,
                    is_training_mode, inplace_map, safe_run_mode, args);
}

std::vector<PyObject*> backward_runner(const char* func_name,
                                       void* callback,
                                       const std::vector<int64_t>& requires_grad_flags,
                                       const std::vector<int64_t>& tensor_flags,
                                       const bool is_training_mode,
                                       const std::vector<int64_t>& inplace_map,
                                       const char* /*kernel_invoke_id*/,
                                       const bool safe_run_mode,
                                       const std::vector<PyObject*>& args) {
  return run_driver(backward_driver, "backward", func_name, callback, requires_grad_flags, tensor_flags,
                    is_training_mode, inplace_map, safe_run_mode, args);
}

// The runner type ORT casts the registered addresses to; a mismatch here would not link-fail, so
// both runners are checked against it at compile time.
using RunnerType = std::vector<PyObject*> (*)(const char*, void*, const std::vector<int64_t>&,
                                              const std::vector<int64_t>&, const bool,
                                              const std::vector<int64_t>&, const char*, const bool,
                                              const std::vector<PyObject*>&);
constexpr RunnerType forward_runner_ptr = &forward_runner;
constexpr RunnerType backward_runner_ptr = &backward_runner;

void set_drivers(py::object forward, py::object backward) {
  TORCH_CHECK(PyCallable_Check(forward.ptr()) && PyCallable_Check(backward.ptr()), "drivers must be callable");
  Py_XDECREF(forward_driver);
  Py_XDECREF(backward_driver);
  forward_driver = forward.inc_ref().ptr();
  backward_driver = backward.inc_ref().ptr();
}

bool materialize_grads(py::handle ctx) {
  TORCH_CHECK(THPFunction_Check(ctx.ptr()), "expected the autograd context of a custom autograd.Function");
  return reinterpret_cast<THPFunction*>(ctx.ptr())->materialize_grads;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lightning_ort: runners for custom autograd.Functions inside ONNX Runtime graphs";
  m.def("set_drivers", &set_drivers, "Register the Python forward and backward drivers.");
  m.def("forward_runner_address", []() { return reinterpret_cast<size_t>(forward_runner_ptr); });
  m.def("backward_runner_address", []() { return reinterpret_cast<size_t>(backward_runner_ptr); });
  m.def("materialize_grads", &materialize_grads, "ctx.set_materialize_grads() state of an autograd context.");
}
