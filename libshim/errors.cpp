// Error names and descriptions, answered locally (no broker needed, valid before cuInit).
// The list was generated from cuda.h's CUresult enum (names and the first sentence of each
// description); regenerate it when cuda.h adds codes.
#include <cstring>

#include "libshim/api.hpp"

#define MPSSHIM_ERRORS(X)                                                                          \
  X(CUDA_SUCCESS, "The API call returned with no errors")                                          \
  X(CUDA_ERROR_INVALID_VALUE,                                                                      \
    "This indicates that one or more of the parameters passed to the API call is not within an "   \
    "acceptable range of values")                                                                  \
  X(CUDA_ERROR_OUT_OF_MEMORY,                                                                      \
    "The API call failed because it was unable to allocate enough memory or other resources to "   \
    "perform the requested operation")                                                             \
  X(CUDA_ERROR_NOT_INITIALIZED,                                                                    \
    "This indicates that the CUDA driver has not been initialized with cuInit() or that "          \
    "initialization has failed")                                                                   \
  X(CUDA_ERROR_DEINITIALIZED,                                                                      \
    "This indicates that the CUDA driver is in the process of shutting down")                      \
  X(CUDA_ERROR_PROFILER_DISABLED, "This indicates profiler is not initialized for this run")       \
  X(CUDA_ERROR_PROFILER_NOT_INITIALIZED,                                                           \
    "Deprecated: This error return is deprecated as of CUDA 5.0")                                  \
  X(CUDA_ERROR_PROFILER_ALREADY_STARTED,                                                           \
    "Deprecated: This error return is deprecated as of CUDA 5.0")                                  \
  X(CUDA_ERROR_PROFILER_ALREADY_STOPPED,                                                           \
    "Deprecated: This error return is deprecated as of CUDA 5.0")                                  \
  X(CUDA_ERROR_STUB_LIBRARY,                                                                       \
    "This indicates that the CUDA driver that the application has loaded is a stub library")       \
  X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,                                                         \
    "This indicates that the API call requires a newer CUDA driver than the one currently "        \
    "installed")                                                                                   \
  X(CUDA_ERROR_DEVICE_UNAVAILABLE,                                                                 \
    "This indicates that requested CUDA device is unavailable at the current time")                \
  X(CUDA_ERROR_NO_DEVICE,                                                                          \
    "This indicates that no CUDA-capable devices were detected by the installed CUDA driver")      \
  X(CUDA_ERROR_INVALID_DEVICE,                                                                     \
    "This indicates that the device ordinal supplied by the user does not correspond to a valid "  \
    "CUDA device or that the action requested is invalid for the specified device")                \
  X(CUDA_ERROR_DEVICE_NOT_LICENSED, "This error indicates that the Grid license is not applied")   \
  X(CUDA_ERROR_INVALID_IMAGE, "This indicates that the device kernel image is invalid")            \
  X(CUDA_ERROR_INVALID_CONTEXT,                                                                    \
    "This most frequently indicates that there is no context bound to the current thread")         \
  X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT,                                                            \
    "This indicated that the context being supplied as a parameter to the API call was already "   \
    "the active context")                                                                          \
  X(CUDA_ERROR_MAP_FAILED, "This indicates that a map or register operation has failed")           \
  X(CUDA_ERROR_UNMAP_FAILED, "This indicates that an unmap or unregister operation has failed")    \
  X(CUDA_ERROR_ARRAY_IS_MAPPED,                                                                    \
    "This indicates that the specified array is currently mapped and thus cannot be destroyed")    \
  X(CUDA_ERROR_ALREADY_MAPPED, "This indicates that the resource is already mapped")               \
  X(CUDA_ERROR_NO_BINARY_FOR_GPU,                                                                  \
    "This indicates that there is no kernel image available that is suitable for the device")      \
  X(CUDA_ERROR_ALREADY_ACQUIRED, "This indicates that a resource has already been acquired")       \
  X(CUDA_ERROR_NOT_MAPPED, "This indicates that a resource is not mapped")                         \
  X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY,                                                                \
    "This indicates that a mapped resource is not available for access as an array")               \
  X(CUDA_ERROR_NOT_MAPPED_AS_POINTER,                                                              \
    "This indicates that a mapped resource is not available for access as a pointer")              \
  X(CUDA_ERROR_ECC_UNCORRECTABLE,                                                                  \
    "This indicates that an uncorrectable ECC error was detected during execution")                \
  X(CUDA_ERROR_UNSUPPORTED_LIMIT,                                                                  \
    "This indicates that the CUlimit passed to the API call is not supported by the active "       \
    "device")                                                                                      \
  X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE,                                                             \
    "This indicates that the CUcontext passed to the API call can only be bound to a single CPU "  \
    "thread at a time but is already bound to a CPU thread")                                       \
  X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,                                                            \
    "This indicates that peer access is not supported across the given devices")                   \
  X(CUDA_ERROR_INVALID_PTX, "This indicates that a PTX JIT compilation failed")                    \
  X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "This indicates an error with OpenGL or DirectX context") \
  X(CUDA_ERROR_NVLINK_UNCORRECTABLE,                                                               \
    "This indicates that an uncorrectable NVLink error was detected during the execution")         \
  X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND,                                                             \
    "This indicates that the PTX JIT compiler library was not found")                              \
  X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,                                                            \
    "This indicates that the provided PTX was compiled with an unsupported toolchain")             \
  X(CUDA_ERROR_JIT_COMPILATION_DISABLED,                                                           \
    "This indicates that the PTX JIT compilation was disabled")                                    \
  X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,                                                          \
    "This indicates that the CUexecAffinityType passed to the API call is not supported by the "   \
    "active device")                                                                               \
  X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,                                                           \
    "This indicates that the code to be compiled by the PTX JIT contains unsupported call to "     \
    "cudaDeviceSynchronize")                                                                       \
  X(CUDA_ERROR_CONTAINED,                                                                          \
    "This indicates that an exception occurred on the device that is now contained by the GPU's "  \
    "error containment capability")                                                                \
  X(CUDA_ERROR_INVALID_SOURCE, "This indicates that the device kernel source is invalid")          \
  X(CUDA_ERROR_FILE_NOT_FOUND, "This indicates that the file specified was not found")             \
  X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,                                                     \
    "This indicates that a link to a shared object failed to resolve")                             \
  X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,                                                          \
    "This indicates that initialization of a shared object failed")                                \
  X(CUDA_ERROR_OPERATING_SYSTEM, "This indicates that an OS call failed")                          \
  X(CUDA_ERROR_INVALID_HANDLE,                                                                     \
    "This indicates that a resource handle passed to the API call was not valid")                  \
  X(CUDA_ERROR_ILLEGAL_STATE,                                                                      \
    "This indicates that a resource required by the API call is not in a valid state to perform "  \
    "the requested operation")                                                                     \
  X(CUDA_ERROR_LOSSY_QUERY,                                                                        \
    "This indicates an attempt was made to introspect an object in a way that would discard "      \
    "semantically important information")                                                          \
  X(CUDA_ERROR_NOT_FOUND, "This indicates that a named symbol was not found")                      \
  X(CUDA_ERROR_NOT_READY,                                                                          \
    "This indicates that asynchronous operations issued previously have not completed yet")        \
  X(CUDA_ERROR_ILLEGAL_ADDRESS,                                                                    \
    "While executing a kernel, the device encountered a load or store instruction on an invalid "  \
    "memory address")                                                                              \
  X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,                                                            \
    "This indicates that a launch did not occur because it did not have appropriate resources")    \
  X(CUDA_ERROR_LAUNCH_TIMEOUT, "This indicates that the device kernel took too long to execute")   \
  X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,                                                      \
    "This error indicates a kernel launch that uses an incompatible texturing mode")               \
  X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,                                                        \
    "This error indicates that a call to cuCtxEnablePeerAccess() is trying to re-enable peer "     \
    "access to a context which has already had peer access to it enabled")                         \
  X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,                                                            \
    "This error indicates that cuCtxDisablePeerAccess() is trying to disable peer access which "   \
    "has not been enabled yet via cuCtxEnablePeerAccess()")                                        \
  X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,                                                             \
    "This error indicates that the primary context for the specified device has already been "     \
    "initialized")                                                                                 \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED,                                                               \
    "This error indicates that the context current to the calling thread has been destroyed "      \
    "using cuCtxDestroy, or is a primary context which has not yet been initialized")              \
  X(CUDA_ERROR_ASSERT, "A device-side assert triggered during kernel execution")                   \
  X(CUDA_ERROR_TOO_MANY_PEERS,                                                                     \
    "This error indicates that the hardware resources required to enable peer access have been "   \
    "exhausted for one or more of the devices passed to cuCtxEnablePeerAccess()")                  \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,                                                     \
    "This error indicates that the memory range passed to cuMemHostRegister() has already been "   \
    "registered")                                                                                  \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,                                                         \
    "This error indicates that the pointer passed to cuMemHostUnregister() does not correspond "   \
    "to any currently registered memory region")                                                   \
  X(CUDA_ERROR_HARDWARE_STACK_ERROR,                                                               \
    "While executing a kernel, the device encountered a stack error")                              \
  X(CUDA_ERROR_ILLEGAL_INSTRUCTION,                                                                \
    "While executing a kernel, the device encountered an illegal instruction")                     \
  X(CUDA_ERROR_MISALIGNED_ADDRESS,                                                                 \
    "While executing a kernel, the device encountered a load or store instruction on a memory "    \
    "address which is not aligned")                                                                \
  X(CUDA_ERROR_INVALID_ADDRESS_SPACE,                                                              \
    "While executing a kernel, the device encountered an instruction which can only operate on "   \
    "memory locations in certain address spaces (global, shared, or local), but was supplied a "   \
    "memory address not belonging to an allowed address space")                                    \
  X(CUDA_ERROR_INVALID_PC,                                                                         \
    "While executing a kernel, the device program counter wrapped its address space")              \
  X(CUDA_ERROR_LAUNCH_FAILED, "An exception occurred on the device while executing a kernel")      \
  X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,                                                       \
    "This error indicates that the number of blocks launched per grid for a kernel that was "      \
    "launched via either cuLaunchCooperativeKernel or cuLaunchCooperativeKernelMultiDevice "       \
    "exceeds the maximum number of blocks as allowed by "                                          \
    "cuOccupancyMaxActiveBlocksPerMultiprocessor or "                                              \
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags times the number of multiprocessors as " \
    "specified by the device attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")                  \
  X(CUDA_ERROR_TENSOR_MEMORY_LEAK,                                                                 \
    "An exception occurred on the device while exiting a kernel using tensor memory: the tensor "  \
    "memory was not completely deallocated")                                                       \
  X(CUDA_ERROR_NOT_PERMITTED,                                                                      \
    "This error indicates that the attempted operation is not permitted")                          \
  X(CUDA_ERROR_NOT_SUPPORTED,                                                                      \
    "This error indicates that the attempted operation is not supported on the current system or " \
    "device")                                                                                      \
  X(CUDA_ERROR_SYSTEM_NOT_READY,                                                                   \
    "This error indicates that the system is not yet ready to start any CUDA work")                \
  X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,                                                             \
    "This error indicates that there is a mismatch between the versions of the display driver "    \
    "and the CUDA driver")                                                                         \
  X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,                                                     \
    "This error indicates that the system was upgraded to run with forward compatibility but the " \
    "visible hardware detected by CUDA does not support this configuration")                       \
  X(CUDA_ERROR_MPS_CONNECTION_FAILED,                                                              \
    "This error indicates that the MPS client failed to connect to the MPS control daemon or the " \
    "MPS server")                                                                                  \
  X(CUDA_ERROR_MPS_RPC_FAILURE,                                                                    \
    "This error indicates that the remote procedural call between the MPS server and the MPS "     \
    "client failed")                                                                               \
  X(CUDA_ERROR_MPS_SERVER_NOT_READY,                                                               \
    "This error indicates that the MPS server is not ready to accept new MPS client requests")     \
  X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,                                                            \
    "This error indicates that the hardware resources required to create MPS client have been "    \
    "exhausted")                                                                                   \
  X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,                                                        \
    "This error indicates the the hardware resources required to support device connections have " \
    "been exhausted")                                                                              \
  X(CUDA_ERROR_MPS_CLIENT_TERMINATED,                                                              \
    "This error indicates that the MPS client has been terminated by the server")                  \
  X(CUDA_ERROR_CDP_NOT_SUPPORTED,                                                                  \
    "This error indicates that the module is using CUDA Dynamic Parallelism, but the current "     \
    "configuration, like MPS, does not support it")                                                \
  X(CUDA_ERROR_CDP_VERSION_MISMATCH,                                                               \
    "This error indicates that a module contains an unsupported interaction between different "    \
    "versions of CUDA Dynamic Parallelism")                                                        \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,                                                         \
    "This error indicates that the operation is not permitted when the stream is capturing")       \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                                         \
    "This error indicates that the current capture sequence on the stream has been invalidated "   \
    "due to a previous error")                                                                     \
  X(CUDA_ERROR_STREAM_CAPTURE_MERGE,                                                               \
    "This error indicates that the operation would have resulted in a merge of two independent "   \
    "capture sequences")                                                                           \
  X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,                                                           \
    "This error indicates that the capture was not initiated in this stream")                      \
  X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED,                                                            \
    "This error indicates that the capture sequence contains a fork that was not joined to the "   \
    "primary stream")                                                                              \
  X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,                                                           \
    "This error indicates that a dependency would have been created which crosses the capture "    \
    "sequence boundary")                                                                           \
  X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,                                                            \
    "This error indicates a disallowed implicit dependency on a current capture sequence from "    \
    "cudaStreamLegacy")                                                                            \
  X(CUDA_ERROR_CAPTURED_EVENT,                                                                     \
    "This error indicates that the operation is not permitted on an event which was last "         \
    "recorded in a capturing stream")                                                              \
  X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,                                                        \
    "A stream capture sequence not initiated with the CU_STREAM_CAPTURE_MODE_RELAXED argument to " \
    "cuStreamBeginCapture was passed to cuStreamEndCapture in a different thread")                 \
  X(CUDA_ERROR_TIMEOUT,                                                                            \
    "This error indicates that the timeout specified for the wait operation has lapsed")           \
  X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,                                                          \
    "This error indicates that the graph update was not performed because it included changes "    \
    "which violated constraints specific to instantiated graph update")                            \
  X(CUDA_ERROR_EXTERNAL_DEVICE,                                                                    \
    "This indicates that an async error has occurred in a device outside of CUDA")                 \
  X(CUDA_ERROR_INVALID_CLUSTER_SIZE,                                                               \
    "Indicates a kernel launch error due to cluster misconfiguration")                             \
  X(CUDA_ERROR_FUNCTION_NOT_LOADED,                                                                \
    "Indiciates a function handle is not loaded when calling an API that requires a loaded "       \
    "function")                                                                                    \
  X(CUDA_ERROR_INVALID_RESOURCE_TYPE,                                                              \
    "This error indicates one or more resources passed in are not valid resource types for the "   \
    "operation")                                                                                   \
  X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,                                                     \
    "This error indicates one or more resources are insufficient or non-applicable for the "       \
    "operation")                                                                                   \
  X(CUDA_ERROR_KEY_ROTATION,                                                                       \
    "This error indicates that an error happened during the key rotation sequence")                \
  X(CUDA_ERROR_UNKNOWN, "This indicates that an unknown internal error has occurred")

namespace {

struct ErrorText {
  CUresult code;
  const char* name;
  const char* description;
};

constexpr ErrorText kErrors[] = {
#define MPSSHIM_ERROR_ENTRY(name, text) {name, #name, text},
    MPSSHIM_ERRORS(MPSSHIM_ERROR_ENTRY)
#undef MPSSHIM_ERROR_ENTRY
};

const ErrorText* find(CUresult code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

// As the real driver: an unknown code gives CUDA_ERROR_INVALID_VALUE and NULL.
MPSSHIM_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find(error);
  *name = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find(error);
  *text = e ? e->description : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
