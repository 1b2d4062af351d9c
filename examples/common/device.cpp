#include "examples/common/device.hpp"

#include "examples/common/check.hpp"

namespace mpsshim::examples {

Device open_device(int ordinal) {
  Device device;
  device.ordinal = ordinal;
  CU_CHECK(cuInit(0));
  CU_CHECK(cuDeviceGet(&device.device, ordinal));
  CU_CHECK(cuDevicePrimaryCtxRetain(&device.context, device.device));
  CU_CHECK(cuCtxSetCurrent(device.context));
  return device;
}

void close_device(const Device& device) {
  CU_CHECK(cuCtxSetCurrent(nullptr));
  CU_CHECK(cuDevicePrimaryCtxRelease(device.device));
}

int device_attribute(const Device& device, CUdevice_attribute attribute) {
  int value = 0;
  CU_CHECK(cuDeviceGetAttribute(&value, attribute, device.device));
  return value;
}

CUmodule load_image_module() {
  CUmodule module = nullptr;
  CU_CHECK(cuModuleLoadData(&module, kDeviceImage));
  return module;
}

CUfunction get_function(CUmodule module, const char* name) {
  CUfunction function = nullptr;
  CU_CHECK(cuModuleGetFunction(&function, module, name));
  return function;
}

}  // namespace mpsshim::examples
