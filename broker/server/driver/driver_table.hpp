// The driver entry points the server uses, resolved with dlsym from the driver it loads (the
// real libcuda.so.1, or the test driver under tests/). One list: it declares the table, loads
// it, and tells the test driver what it must export. Names are the exported (versioned)
// symbols, so the server gets the ABI it was compiled against without cuGetProcAddress.
#pragma once

#include <cuda.h>

#include <string>

// X(exported_symbol, return_type, (parameter list))
#define MPSSHIM_DRIVER_FUNCTIONS(X)                                                                \
  X(cuInit, CUresult, (unsigned int))                                                              \
  X(cuDriverGetVersion, CUresult, (int*))                                                          \
  X(cuGetErrorName, CUresult, (CUresult, const char**))                                            \
  X(cuGetErrorString, CUresult, (CUresult, const char**))                                          \
  X(cuDeviceGet, CUresult, (CUdevice*, int))                                                       \
  X(cuDeviceGetCount, CUresult, (int*))                                                            \
  X(cuDeviceGetName, CUresult, (char*, int, CUdevice))                                             \
  X(cuDeviceGetUuid_v2, CUresult, (CUuuid*, CUdevice))                                             \
  X(cuDeviceTotalMem_v2, CUresult, (size_t*, CUdevice))                                            \
  X(cuDeviceGetAttribute, CUresult, (int*, CUdevice_attribute, CUdevice))                          \
  X(cuDeviceGetDevResource, CUresult, (CUdevice, CUdevResource*, CUdevResourceType))               \
  X(cuDevSmResourceSplitByCount, CUresult,                                                         \
    (CUdevResource*, unsigned int*, const CUdevResource*, CUdevResource*, unsigned int,            \
     unsigned int))                                                                                \
  X(cuDevResourceGenerateDesc, CUresult, (CUdevResourceDesc*, CUdevResource*, unsigned int))       \
  X(cuGreenCtxCreate, CUresult, (CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned int))          \
  X(cuGreenCtxDestroy, CUresult, (CUgreenCtx))                                                     \
  X(cuGreenCtxStreamCreate, CUresult, (CUstream*, CUgreenCtx, unsigned int, int))                  \
  X(cuCtxFromGreenCtx, CUresult, (CUcontext*, CUgreenCtx))                                         \
  X(cuGreenCtxGetDevResource, CUresult, (CUgreenCtx, CUdevResource*, CUdevResourceType))           \
  X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext*, CUdevice))                                    \
  X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice))                                            \
  X(cuCtxSetCurrent, CUresult, (CUcontext))                                                        \
  X(cuCtxSynchronize, CUresult, ())                                                                \
  X(cuCtxSetLimit, CUresult, (CUlimit, size_t))                                                    \
  X(cuCtxGetLimit, CUresult, (size_t*, CUlimit))                                                   \
  X(cuCtxGetStreamPriorityRange, CUresult, (int*, int*))                                           \
  X(cuMemAlloc_v2, CUresult, (CUdeviceptr*, size_t))                                               \
  X(cuMemAllocPitch_v2, CUresult, (CUdeviceptr*, size_t*, size_t, size_t, unsigned int))           \
  X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                         \
  X(cuMemGetInfo_v2, CUresult, (size_t*, size_t*))                                                 \
  X(cuMemHostRegister_v2, CUresult, (void*, size_t, unsigned int))                                 \
  X(cuMemHostUnregister, CUresult, (void*))                                                        \
  X(cuMemHostGetDevicePointer_v2, CUresult, (CUdeviceptr*, void*, unsigned int))                   \
  X(cuMemcpyHtoDAsync_v2, CUresult, (CUdeviceptr, const void*, size_t, CUstream))                  \
  X(cuMemcpyDtoHAsync_v2, CUresult, (void*, CUdeviceptr, size_t, CUstream))                        \
  X(cuMemcpyDtoDAsync_v2, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                  \
  X(cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))                     \
  X(cuMemsetD16Async, CUresult, (CUdeviceptr, unsigned short, size_t, CUstream))                   \
  X(cuMemsetD32Async, CUresult, (CUdeviceptr, unsigned int, size_t, CUstream))                     \
  X(cuMemsetD2D8Async, CUresult, (CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream))   \
  X(cuMemsetD2D16Async, CUresult, (CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream)) \
  X(cuMemsetD2D32Async, CUresult, (CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream))   \
  X(cuModuleLoadData, CUresult, (CUmodule*, const void*))                                          \
  X(cuModuleUnload, CUresult, (CUmodule))                                                          \
  X(cuModuleGetFunction, CUresult, (CUfunction*, CUmodule, const char*))                           \
  X(cuModuleGetFunctionCount, CUresult, (unsigned int*, CUmodule))                                 \
  X(cuModuleEnumerateFunctions, CUresult, (CUfunction*, unsigned int, CUmodule))                   \
  X(cuFuncGetName, CUresult, (const char**, CUfunction))                                           \
  X(cuModuleGetGlobal_v2, CUresult, (CUdeviceptr*, size_t*, CUmodule, const char*))                \
  X(cuLibraryLoadData, CUresult,                                                                   \
    (CUlibrary*, const void*, CUjit_option*, void**, unsigned int, CUlibraryOption*, void**,       \
     unsigned int))                                                                                \
  X(cuLibraryUnload, CUresult, (CUlibrary))                                                        \
  X(cuLibraryGetKernel, CUresult, (CUkernel*, CUlibrary, const char*))                             \
  X(cuLibraryGetKernelCount, CUresult, (unsigned int*, CUlibrary))                                 \
  X(cuLibraryEnumerateKernels, CUresult, (CUkernel*, unsigned int, CUlibrary))                     \
  X(cuKernelGetName, CUresult, (const char**, CUkernel))                                           \
  X(cuLibraryGetModule, CUresult, (CUmodule*, CUlibrary))                                          \
  X(cuLibraryGetGlobal, CUresult, (CUdeviceptr*, size_t*, CUlibrary, const char*))                 \
  X(cuKernelGetFunction, CUresult, (CUfunction*, CUkernel))                                        \
  X(cuKernelGetAttribute, CUresult, (int*, CUfunction_attribute, CUkernel, CUdevice))              \
  X(cuKernelSetAttribute, CUresult, (CUfunction_attribute, int, CUkernel, CUdevice))               \
  X(cuKernelGetParamInfo, CUresult, (CUkernel, size_t, size_t*, size_t*))                          \
  X(cuFuncGetParamInfo, CUresult, (CUfunction, size_t, size_t*, size_t*))                          \
  X(cuFuncGetAttribute, CUresult, (int*, CUfunction_attribute, CUfunction))                        \
  X(cuFuncSetAttribute, CUresult, (CUfunction, CUfunction_attribute, int))                         \
  X(cuFuncSetCacheConfig, CUresult, (CUfunction, CUfunc_cache))                                    \
  X(cuLaunchKernel, CUresult,                                                                      \
    (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,             \
     unsigned int, unsigned int, CUstream, void**, void**))                                        \
  X(cuLaunchKernelEx, CUresult, (const CUlaunchConfig*, CUfunction, void**, void**))               \
  X(cuStreamDestroy_v2, CUresult, (CUstream))                                                      \
  X(cuStreamQuery, CUresult, (CUstream))                                                           \
  X(cuStreamSynchronize, CUresult, (CUstream))                                                     \
  X(cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int))                                \
  X(cuEventCreate, CUresult, (CUevent*, unsigned int))                                             \
  X(cuEventDestroy_v2, CUresult, (CUevent))                                                        \
  X(cuEventRecordWithFlags, CUresult, (CUevent, CUstream, unsigned int))                           \
  X(cuStreamWriteValue32_v2, CUresult, (CUstream, CUdeviceptr, cuuint32_t, unsigned int))          \
  X(cuStreamWriteValue64_v2, CUresult, (CUstream, CUdeviceptr, cuuint64_t, unsigned int))          \
  X(cuStreamWaitValue32_v2, CUresult, (CUstream, CUdeviceptr, cuuint32_t, unsigned int))           \
  X(cuStreamWaitValue64_v2, CUresult, (CUstream, CUdeviceptr, cuuint64_t, unsigned int))           \
  X(cuMemBatchDecompressAsync, CUresult,                                                           \
    (CUmemDecompressParams*, size_t, unsigned int, size_t*, CUstream))                             \
  X(cuMemMapArrayAsync, CUresult, (CUarrayMapInfo*, unsigned int, CUstream))                       \
  X(cuStreamBatchMemOp_v2, CUresult,                                                               \
    (CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int))                             \
  X(cuStreamGetAttribute, CUresult, (CUstream, CUstreamAttrID, CUstreamAttrValue*))                \
  X(cuStreamSetAttribute, CUresult, (CUstream, CUstreamAttrID, const CUstreamAttrValue*))          \
  X(cuStreamCopyAttributes, CUresult, (CUstream, CUstream))                                        \
  X(cuEventQuery, CUresult, (CUevent))                                                             \
  X(cuEventElapsedTime_v2, CUresult, (float*, CUevent, CUevent))                                   \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, CUresult,                                \
    (int*, CUfunction, int, size_t, unsigned int))                                                 \
  X(cuOccupancyMaxActiveClusters, CUresult, (int*, CUfunction, const CUlaunchConfig*))             \
  X(cuOccupancyMaxPotentialClusterSize, CUresult, (int*, CUfunction, const CUlaunchConfig*))       \
  X(cuTensorMapEncodeTiled, CUresult,                                                              \
    (CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,   \
     const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,              \
     CUtensorMapL2promotion, CUtensorMapFloatOOBfill))                                             \
  X(cuTensorMapEncodeIm2col, CUresult,                                                             \
    (CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,   \
     const int*, const int*, cuuint32_t, cuuint32_t, const cuuint32_t*, CUtensorMapInterleave,     \
     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill))                         \
  X(cuTensorMapEncodeIm2colWide, CUresult,                                                         \
    (CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,   \
     int, int, cuuint32_t, cuuint32_t, const cuuint32_t*, CUtensorMapInterleave,                   \
     CUtensorMapIm2ColWideMode, CUtensorMapSwizzle, CUtensorMapL2promotion,                        \
     CUtensorMapFloatOOBfill))                                                                     \
  X(cuTensorMapReplaceAddress, CUresult, (CUtensorMap*, void*))                                    \
  X(cuOccupancyAvailableDynamicSMemPerBlock, CUresult, (size_t*, CUfunction, int, int))            \
  X(cuMemcpy3DAsync_v2, CUresult, (const CUDA_MEMCPY3D*, CUstream))                                \
  X(cuArray3DCreate_v2, CUresult, (CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*))                      \
  X(cuArrayDestroy, CUresult, (CUarray))                                                           \
  X(cuMipmappedArrayCreate, CUresult,                                                              \
    (CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*, unsigned int))                             \
  X(cuMipmappedArrayGetLevel, CUresult, (CUarray*, CUmipmappedArray, unsigned int))                \
  X(cuMipmappedArrayDestroy, CUresult, (CUmipmappedArray))                                         \
  X(cuArray3DGetDescriptor_v2, CUresult, (CUDA_ARRAY3D_DESCRIPTOR*, CUarray))                      \
  X(cuMipmappedArrayGetSparseProperties, CUresult,                                                 \
    (CUDA_ARRAY_SPARSE_PROPERTIES*, CUmipmappedArray))                                             \
  X(cuMipmappedArrayGetMemoryRequirements, CUresult,                                               \
    (CUDA_ARRAY_MEMORY_REQUIREMENTS*, CUmipmappedArray, CUdevice))                                 \
  X(cuTexObjectCreate, CUresult,                                                                   \
    (CUtexObject*, const CUDA_RESOURCE_DESC*, const CUDA_TEXTURE_DESC*,                            \
     const CUDA_RESOURCE_VIEW_DESC*))                                                              \
  X(cuTexObjectDestroy, CUresult, (CUtexObject))                                                   \
  X(cuSurfObjectCreate, CUresult, (CUsurfObject*, const CUDA_RESOURCE_DESC*))                      \
  X(cuSurfObjectDestroy, CUresult, (CUsurfObject))                                                 \
  X(cuStreamBeginCapture_v2, CUresult, (CUstream, CUstreamCaptureMode))                            \
  X(cuStreamBeginCaptureToGraph, CUresult,                                                         \
    (CUstream, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t, CUstreamCaptureMode))  \
  X(cuStreamEndCapture, CUresult, (CUstream, CUgraph*))                                            \
  X(cuStreamIsCapturing, CUresult, (CUstream, CUstreamCaptureStatus*))                             \
  X(cuStreamGetCaptureInfo_v3, CUresult,                                                           \
    (CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*, const CUgraphNode**,                 \
     const CUgraphEdgeData**, size_t*))                                                            \
  X(cuStreamUpdateCaptureDependencies_v2, CUresult,                                                \
    (CUstream, CUgraphNode*, const CUgraphEdgeData*, size_t, unsigned int))                        \
  X(cuGraphCreate, CUresult, (CUgraph*, unsigned int))                                             \
  X(cuGraphDestroy, CUresult, (CUgraph))                                                           \
  X(cuGraphGetNodes, CUresult, (CUgraph, CUgraphNode*, size_t*))                                   \
  X(cuGraphGetEdges_v2, CUresult,                                                                  \
    (CUgraph, CUgraphNode*, CUgraphNode*, CUgraphEdgeData*, size_t*))                              \
  X(cuGraphInstantiateWithFlags, CUresult, (CUgraphExec*, CUgraph, unsigned long long))            \
  X(cuGraphExecDestroy, CUresult, (CUgraphExec))                                                   \
  X(cuGraphLaunch, CUresult, (CUgraphExec, CUstream))                                              \
  X(cuGraphUpload, CUresult, (CUgraphExec, CUstream))                                              \
  X(cuGraphExecUpdate_v2, CUresult, (CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*))          \
  X(cuGraphAddKernelNode_v2, CUresult,                                                             \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS*))           \
  X(cuGraphExecKernelNodeSetParams_v2, CUresult,                                                   \
    (CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS*))                                    \
  X(cuGraphKernelNodeSetParams_v2, CUresult, (CUgraphNode, const CUDA_KERNEL_NODE_PARAMS*))        \
  X(cuGraphMemsetNodeSetParams, CUresult, (CUgraphNode, const CUDA_MEMSET_NODE_PARAMS*))           \
  X(cuGraphExecMemsetNodeSetParams, CUresult,                                                      \
    (CUgraphExec, CUgraphNode, const CUDA_MEMSET_NODE_PARAMS*, CUcontext))                         \
  X(cuGraphMemcpyNodeSetParams, CUresult, (CUgraphNode, const CUDA_MEMCPY3D*))                     \
  X(cuGraphExecMemcpyNodeSetParams, CUresult,                                                      \
    (CUgraphExec, CUgraphNode, const CUDA_MEMCPY3D*, CUcontext))                                   \
  X(cuGraphNodeSetEnabled, CUresult, (CUgraphExec, CUgraphNode, unsigned int))                     \
  X(cuGraphAddMemsetNode, CUresult,                                                                \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_MEMSET_NODE_PARAMS*,            \
     CUcontext))                                                                                   \
  X(cuGraphAddMemcpyNode, CUresult,                                                                \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_MEMCPY3D*, CUcontext))          \
  X(cuGraphAddEmptyNode, CUresult, (CUgraphNode*, CUgraph, const CUgraphNode*, size_t))            \
  X(cuGraphAddChildGraphNode, CUresult,                                                            \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph))                                  \
  X(cuGraphChildGraphNodeGetGraph, CUresult, (CUgraphNode, CUgraph*))                              \
  X(cuGraphNodeGetType, CUresult, (CUgraphNode, CUgraphNodeType*))                                 \
  X(cuGraphExecChildGraphNodeSetParams, CUresult, (CUgraphExec, CUgraphNode, CUgraph))             \
  X(cuGraphAddDependencies_v2, CUresult,                                                           \
    (CUgraph, const CUgraphNode*, const CUgraphNode*, const CUgraphEdgeData*, size_t))             \
  X(cuGraphRemoveDependencies_v2, CUresult,                                                        \
    (CUgraph, const CUgraphNode*, const CUgraphNode*, const CUgraphEdgeData*, size_t))             \
  X(cuGraphAddEventRecordNode, CUresult,                                                           \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUevent))                                  \
  X(cuGraphAddEventWaitNode, CUresult,                                                             \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUevent))                                  \
  X(cuGraphEventRecordNodeSetEvent, CUresult, (CUgraphNode, CUevent))                              \
  X(cuGraphEventWaitNodeSetEvent, CUresult, (CUgraphNode, CUevent))                                \
  X(cuGraphExecEventRecordNodeSetEvent, CUresult, (CUgraphExec, CUgraphNode, CUevent))             \
  X(cuGraphExecEventWaitNodeSetEvent, CUresult, (CUgraphExec, CUgraphNode, CUevent))               \
  X(cuGraphAddHostNode, CUresult,                                                                  \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_HOST_NODE_PARAMS*))             \
  X(cuGraphHostNodeSetParams, CUresult, (CUgraphNode, const CUDA_HOST_NODE_PARAMS*))               \
  X(cuGraphExecHostNodeSetParams, CUresult,                                                        \
    (CUgraphExec, CUgraphNode, const CUDA_HOST_NODE_PARAMS*))                                      \
  X(cuGraphAddMemAllocNode, CUresult,                                                              \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUDA_MEM_ALLOC_NODE_PARAMS*))              \
  X(cuGraphAddMemFreeNode, CUresult,                                                               \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUdeviceptr))                              \
  X(cuGraphNodeGetEnabled, CUresult, (CUgraphExec, CUgraphNode, unsigned int*))                    \
  X(cuGraphDestroyNode, CUresult, (CUgraphNode))                                                   \
  X(cuGraphClone, CUresult, (CUgraph*, CUgraph))                                                   \
  X(cuGraphNodeFindInClone, CUresult, (CUgraphNode*, CUgraphNode, CUgraph))                        \
  X(cuLinkCreate_v2, CUresult, (unsigned int, CUjit_option*, void**, CUlinkState*))                \
  X(cuLinkAddData_v2, CUresult,                                                                    \
    (CUlinkState, CUjitInputType, void*, size_t, const char*, unsigned int, CUjit_option*,         \
     void**))                                                                                      \
  X(cuLinkAddFile_v2, CUresult,                                                                    \
    (CUlinkState, CUjitInputType, const char*, unsigned int, CUjit_option*, void**))               \
  X(cuLinkComplete, CUresult, (CUlinkState, void**, size_t*))                                      \
  X(cuLinkDestroy, CUresult, (CUlinkState))                                                        \
  X(cuGraphConditionalHandleCreate, CUresult,                                                      \
    (CUgraphConditionalHandle*, CUgraph, CUcontext, unsigned int, unsigned int))                   \
  X(cuGraphAddNode_v2, CUresult,                                                                   \
    (CUgraphNode*, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t,                    \
     CUgraphNodeParams*))                                                                          \
  X(cuGraphAddBatchMemOpNode, CUresult,                                                            \
    (CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_BATCH_MEM_OP_NODE_PARAMS*))     \
  X(cuGraphBatchMemOpNodeSetParams, CUresult, (CUgraphNode, const CUDA_BATCH_MEM_OP_NODE_PARAMS*)) \
  X(cuGraphExecBatchMemOpNodeSetParams, CUresult,                                                  \
    (CUgraphExec, CUgraphNode, const CUDA_BATCH_MEM_OP_NODE_PARAMS*))                              \
  X(cuGraphKernelNodeGetAttribute, CUresult,                                                       \
    (CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue*))                                     \
  X(cuGraphKernelNodeSetAttribute, CUresult,                                                       \
    (CUgraphNode, CUkernelNodeAttrID, const CUkernelNodeAttrValue*))                               \
  X(cuGraphKernelNodeCopyAttributes, CUresult, (CUgraphNode, CUgraphNode))                         \
  X(cuArrayGetSparseProperties, CUresult, (CUDA_ARRAY_SPARSE_PROPERTIES*, CUarray))                \
  X(cuArrayGetMemoryRequirements, CUresult, (CUDA_ARRAY_MEMORY_REQUIREMENTS*, CUarray, CUdevice))  \
  X(cuMemGetHandleForAddressRange, CUresult,                                                       \
    (void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long))                        \
  X(cuCtxResetPersistingL2Cache, CUresult, ())                                                     \
  X(cuFlushGPUDirectRDMAWrites, CUresult,                                                          \
    (CUflushGPUDirectRDMAWritesTarget, CUflushGPUDirectRDMAWritesScope))                           \
  X(cuDeviceGetTexture1DLinearMaxWidth, CUresult, (size_t*, CUarray_format, unsigned, CUdevice))   \
  X(cuDeviceGetHostAtomicCapabilities, CUresult,                                                   \
    (unsigned int*, const CUatomicOperation*, unsigned int, CUdevice))                             \
  X(cuDeviceGetP2PAtomicCapabilities, CUresult,                                                    \
    (unsigned int*, const CUatomicOperation*, unsigned int, CUdevice, CUdevice))                   \
  X(cuDeviceGraphMemTrim, CUresult, (CUdevice))                                                    \
  X(cuDeviceGetGraphMemAttribute, CUresult, (CUdevice, CUgraphMem_attribute, void*))               \
  X(cuDeviceSetGraphMemAttribute, CUresult, (CUdevice, CUgraphMem_attribute, void*))               \
  X(cuLaunchHostFunc, CUresult, (CUstream, CUhostFn, void*))                                       \
  X(cuStreamAddCallback, CUresult, (CUstream, CUstreamCallback, void*, unsigned int))              \
  X(cuMemPoolCreate, CUresult, (CUmemoryPool*, const CUmemPoolProps*))                             \
  X(cuMemPoolDestroy, CUresult, (CUmemoryPool))                                                    \
  X(cuMemPoolSetAttribute, CUresult, (CUmemoryPool, CUmemPool_attribute, void*))                   \
  X(cuMemPoolGetAttribute, CUresult, (CUmemoryPool, CUmemPool_attribute, void*))                   \
  X(cuMemPoolTrimTo, CUresult, (CUmemoryPool, size_t))                                             \
  X(cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr*, size_t, CUmemoryPool, CUstream))             \
  X(cuMemFreeAsync, CUresult, (CUdeviceptr, CUstream))                                             \
  X(cuMemGetAllocationGranularity, CUresult,                                                       \
    (size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags))                       \
  X(cuMemCreate, CUresult,                                                                         \
    (CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long))       \
  X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle))                                        \
  X(cuMemAddressReserve, CUresult,                                                                 \
    (CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long))                               \
  X(cuMemAddressFree, CUresult, (CUdeviceptr, size_t))                                             \
  X(cuMemMap, CUresult,                                                                            \
    (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))               \
  X(cuMemUnmap, CUresult, (CUdeviceptr, size_t))                                                   \
  X(cuMemSetAccess, CUresult, (CUdeviceptr, size_t, const CUmemAccessDesc*, size_t))               \
  X(cuMemExportToShareableHandle, CUresult,                                                        \
    (void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long))          \
  X(cuMemImportFromShareableHandle, CUresult,                                                      \
    (CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType))                             \
  X(cuDeviceCanAccessPeer, CUresult, (int*, CUdevice, CUdevice))                                   \
  X(cuDeviceGetP2PAttribute, CUresult, (int*, CUdevice_P2PAttribute, CUdevice, CUdevice))

namespace mpsshim::server {

struct DriverTable {
#define MPSSHIM_DRIVER_MEMBER(name, ret, params) ret(CUDAAPI* name) params = nullptr;
  MPSSHIM_DRIVER_FUNCTIONS(MPSSHIM_DRIVER_MEMBER)
#undef MPSSHIM_DRIVER_MEMBER
};

}  // namespace mpsshim::server
