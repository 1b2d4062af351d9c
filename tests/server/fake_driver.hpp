// An in-process stand-in for the driver, for driving the server's dispatcher without a GPU or
// the test driver library: device memory is host memory, copies and memsets happen at once,
// and a test decides when "GPU work" completes and what it returns.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "broker/server/driver/driver_table.hpp"
#include "tests/server/fake_device_block.hpp"

namespace mpsshim::server::test {

struct FakeGpu {
  // The device.
  unsigned sm_count = 132;
  unsigned min_partition = 8;
  unsigned coscheduled_alignment = 8;
  std::size_t total_memory = std::size_t{80} << 30;
  std::size_t free_memory = std::size_t{70} << 30;

  // What queued work reports: NOT_READY while busy, else work_result.
  bool busy = false;
  CUresult work_result = CUDA_SUCCESS;
  // cuStreamWriteValue32 (host fences): a write lands when it is made while the work is done,
  // or else at the first query that finds the work done; never on failed work.
  struct ValueWrite {
    CUdeviceptr address;
    std::uint32_t value;
  };
  std::vector<ValueWrite> writes_in_flight;
  int value_writes = 0;
  int stream_queries = 0;
  int event_queries = 0;
  // Runs inside each cuLaunchKernelEx (a client posting while the driver takes a launch).
  std::function<void()> on_launch;
  CUresult launch_result = CUDA_SUCCESS;

  // What the server did.
  std::map<CUdeviceptr, DeviceBlock> allocations;
  std::map<void*, std::size_t> host_registrations;
  int host_register_failures = 0;  // the next this many cuMemHostRegister calls fail
  int primary_refs = 0;            // cuDevicePrimaryCtxRetain minus releases
  CUresult primary_retain_result = CUDA_SUCCESS;
  int streams_live = 0;
  int events_live = 0;
  int green_live = 0;
  int green_created = 0;     // cuGreenCtxCreate calls that succeeded (the pool's reuse)
  int ctx_synchronizes = 0;  // cuCtxSynchronize calls
  int green_live_at_primary_release = -1;  // green_live when primary_refs last reached 0
  int modules_live = 0;
  int libraries_live = 0;
  // The last cuLibraryLoadData given a __fatBinC_Wrapper_t: its version and the fat_size of
  // each container it names (the linked one first), read while the wrapper was valid.
  std::uint32_t last_wrapper_version = 0;
  std::vector<std::uint64_t> last_wrapper_containers;
  int launches = 0;
  int stream_waits = 0;
  unsigned last_split_min_count = 0;
  unsigned last_split_flags = 0;
  int last_stream_priority = 0;
  unsigned last_launch_attribute_count = 0;
  std::vector<std::byte> last_launch_args;
  std::size_t limits[CU_LIMIT_MAX] = {};
  // 2D/3D copies, arrays, texture/surface objects (fake_driver_copies.cpp).
  int copies_3d = 0;
  int arrays_live = 0;
  int tex_objects_live = 0;
  std::map<CUarray, std::vector<std::byte>> arrays;
  // The same name gives the same CUfunction/CUkernel again, as the real driver does.
  std::map<std::string, void*> named;
  // Every fake library's kernels, in cuLibraryEnumerateKernels' order (their names as
  // cuKernelGetName gives them); library_kernel_count_result fails cuLibraryGetKernelCount.
  std::vector<std::string> library_kernel_names{"k", "vector_add"};
  CUresult library_kernel_count_result = CUDA_SUCCESS;
  // Graphs as launch batching makes them (add_graph_fakes): kernel nodes and the packed
  // arguments each node last got; a launch counts every node as a launch.
  struct Graph {
    std::vector<std::vector<std::byte>> node_args;
    std::vector<bool> disabled;  // by node index (cuGraphNodeSetEnabled), executable graphs
    bool executable = false;
  };
  std::map<void*, Graph> graphs;                               // CUgraph and CUgraphExec handles
  std::map<void*, std::pair<void*, std::size_t>> graph_nodes;  // node -> (graph, index)
  int graphs_live = 0;
  int graph_execs_live = 0;
  int graph_instantiations = 0;
  int graph_launches = 0;
  int graph_node_updates = 0;
  // What the graph calls return, for tests of the eager fallback.
  CUresult graph_instantiate_result = CUDA_SUCCESS;
  CUresult graph_node_update_result = CUDA_SUCCESS;
  CUresult graph_launch_result = CUDA_SUCCESS;
  CUresult graph_enable_result = CUDA_SUCCESS;
  int graph_node_toggles = 0;

  // Virtual memory management (fake_vmm.cpp): what is live, and the calls that give it back in
  // the order they came ("unmap", "release", "free").
  std::map<CUmemGenericAllocationHandle, std::size_t> vmm_handles;
  std::map<CUdeviceptr, std::size_t> vmm_reservations;
  std::map<CUdeviceptr, std::size_t> vmm_mappings;
  std::vector<std::string> vmm_teardown;
  CUmemGenericAllocationHandle next_vmm_handle = 1;
  int vmm_exports = 0;  // cuMemExportToShareableHandle calls that gave an fd
  CUdeviceptr next_reservation = 0x7e0000000000;

  // Kernels' CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (one value for every kernel):
  // what cuKernelSetAttribute last set, as cuKernelGetAttribute reports it.
  int kernel_dynamic_smem = 48 * 1024;

  void reset() { *this = FakeGpu{}; }
};

FakeGpu& fake_gpu();
// The queued work finishes as on a GPU, by itself: value writes land without anyone asking.
void finish_fake_work();
DriverTable fake_driver_table();
void add_copy_fakes(DriverTable& t);
void add_vmm_fakes(DriverTable& t);

}  // namespace mpsshim::server::test
