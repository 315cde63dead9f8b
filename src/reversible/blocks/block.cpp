#include "reversible/blocks/block.hpp"

#include <sstream>
#include <string>

#include "core/error.hpp"
#include "core/tensor.hpp"

#if FLATMEM_HAVE_CUDA_BLOCKS
#include "core/cuda/device.hpp"
#endif

namespace flatmem::blocks {
namespace {

std::string shape_text(const std::int64_t *shape, int ndim) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < ndim; ++i) s << (i ? ", " : "") << shape[i];
  s << (ndim == 1 ? ",)" : ")");
  return s.str();
}

// "parameters[2] (qkv_weight)": fp32, exactly `expected`'s shape, compact, on
// kDLCPU or (CUDA builds) kDLCUDA; the device is checked against the others' by the caller.
float *check_parameter(const DLTensor *t, const std::string &name, const ParameterShape &expected) {
  const std::int64_t want[2] = {expected.rows, expected.cols};
  const int want_ndim = expected.cols == 0 ? 1 : 2;
  // The shape first, in the form "shape (384, 1000), expected (384, 1152)";
  // dtype, device, data, alignment and strides are check_matrix's / check_vector's.
  if (t->ndim >= 0 && t->ndim <= 8 && (t->ndim == 0 || t->shape != nullptr)) {
    bool same = t->ndim == want_ndim;
    for (int i = 0; same && i < want_ndim; ++i) same = t->shape[i] == want[i];
    if (!same)
      invalid(name, ": shape ", shape_text(t->shape, t->ndim), ", expected ",
              shape_text(want, want_ndim));
  }
  if (want_ndim == 1)
    return check_vector(t, name.c_str(), Dtype::f32, expected.rows, DataUse::required, Devices::cpu_or_cuda)
        .as<float>();
  const MatrixView m = check_matrix(t, name.c_str(), {Dtype::f32}, DataUse::required, Devices::cpu_or_cuda);
  if (m.row_stride != m.cols)
    invalid(name, ": row stride ", m.row_stride, "; expected ", m.cols, " (compact)");
  return m.row<float>(0);
}

// Every tensor on `device` (parameters[0]'s); CUDA memory really on it.
void check_device(const DLTensor *t, const std::string &name, const DLDevice &device, float *data) {
  check_same_device(t->device, name.c_str(), device, "parameters[0]");
#if FLATMEM_HAVE_CUDA_BLOCKS
  if (device.device_type == kDLCUDA) flatmem::cuda::check_device_pointer(data, name.c_str(), device.device_id);
#else
  (void)data;
#endif
}

}  // namespace

void set_parameters(flatmem_block_s &block, const DLTensor *parameters, const DLTensor *gradients) {
  if (parameters == nullptr)
    invalid("parameters: NULL; expected an array of ", num_parameters, " tensors");
  const auto shapes = parameter_shapes(block.options);
  BlockParameters checked;
  const DLDevice device = parameters[0].device;
  for (int i = 0; i < num_parameters; ++i) {
    const std::string index = "[" + std::to_string(i) + "] (" + shapes[i].name + ")";
    checked.value[i] = check_parameter(&parameters[i], "parameters" + index, shapes[i]);
    check_device(&parameters[i], "parameters" + index, device, const_cast<float *>(checked.value[i]));
    if (gradients != nullptr) {
      checked.grad[i] = check_parameter(&gradients[i], "gradients" + index, shapes[i]);
      check_device(&gradients[i], "gradients" + index, device, checked.grad[i]);
    }
  }
  block.parameters = checked;
  block.device = device;
  block.has_parameters = true;
  block.has_gradients = gradients != nullptr;
}

}  // namespace flatmem::blocks
