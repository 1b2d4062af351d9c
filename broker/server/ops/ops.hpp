// The handler of every opcode of proto/ops.hpp. Each takes the record being executed and says
// how it ended; dispatch.cpp checks sizes and reply slots before calling them.
#pragma once

#include "broker/server/ops/call.hpp"

namespace mpsshim::server {

// ops/context.cpp
OpResult op_goodbye(Call& call);
OpResult op_ping(Call& call);
OpResult op_ctx_create(Call& call);
OpResult op_ctx_destroy(Call& call);
OpResult op_ctx_synchronize(Call& call);
OpResult op_ctx_set_limit(Call& call);
OpResult op_ctx_get_limit(Call& call);

// ops/memory.cpp
OpResult op_mem_alloc(Call& call);
OpResult op_mem_alloc_pitch(Call& call);
OpResult op_mem_free(Call& call);
OpResult op_mem_get_info(Call& call);
OpResult op_memset(Call& call);
OpResult op_copy_dtod(Call& call);
// The cuMemAlloc, cuMemAllocPitch or cuMemCreate the session waits for (Session::memory_wait) tried
// again: answered when it fits, or, on the `last_try`, with the driver's CUDA_ERROR_OUT_OF_MEMORY.
// False when it still waits. On the session's worker.
bool retry_waiting_allocation(Session& session, bool last_try);
// An allocation of `bytes` that did not fit, kept for a memory policy when one applies to the
// client (`wait`'s call and its arguments filled in by the caller): true when its answer is now
// owed (the op is deferred), false when it fails at once.
bool wait_for_memory(Call& call, MemoryWait wait);

// ops/host.cpp
OpResult op_host_register(Call& call);
OpResult op_host_unregister(Call& call);
OpResult op_copy_htod(Call& call);
OpResult op_copy_dtoh(Call& call);

// ops/module.cpp
OpResult op_image_load(Call& call);
OpResult op_module_unload(Call& call);
OpResult op_module_get_function(Call& call);
OpResult op_module_get_global(Call& call);
OpResult op_module_function_names(Call& call);
OpResult op_library_unload(Call& call);
OpResult op_library_get_kernel(Call& call);
OpResult op_library_kernel_names(Call& call);
OpResult op_library_get_module(Call& call);
OpResult op_library_get_global(Call& call);
OpResult op_kernel_get_function(Call& call);

// ops/function.cpp
OpResult op_function_get_attribute(Call& call);
OpResult op_function_set_attribute(Call& call);
OpResult op_function_set_cache_config(Call& call);
OpResult op_occupancy_max_active_blocks(Call& call);
OpResult op_occupancy_max_active_clusters(Call& call);
OpResult op_occupancy_max_potential_cluster_size(Call& call);
OpResult op_occupancy_available_dynamic_smem(Call& call);

// ops/launch.cpp
OpResult op_launch_kernel(Call& call);

// ops/stream.cpp
OpResult op_stream_create(Call& call);
OpResult op_stream_destroy(Call& call);
OpResult op_stream_query(Call& call);
OpResult op_stream_synchronize(Call& call);
OpResult op_stream_wait_event(Call& call);

// ops/event.cpp
OpResult op_event_create(Call& call);
OpResult op_event_destroy(Call& call);
OpResult op_event_record(Call& call);
OpResult op_event_query(Call& call);
OpResult op_event_synchronize(Call& call);
OpResult op_event_elapsed_time(Call& call);

// ops/copies.cpp
OpResult op_copy_3d(Call& call);
OpResult op_array_create(Call& call);
OpResult op_array_destroy(Call& call);
OpResult op_tex_object_create(Call& call);
OpResult op_tex_object_destroy(Call& call);
OpResult op_surf_object_create(Call& call);
OpResult op_surf_object_destroy(Call& call);
// ops/graph.cpp
OpResult op_stream_begin_capture(Call& call);
OpResult op_stream_begin_capture_to_graph(Call& call);
OpResult op_stream_end_capture(Call& call);
OpResult op_stream_capture_info(Call& call);
OpResult op_stream_capture_dependencies(Call& call);
OpResult op_stream_update_capture_dependencies(Call& call);
OpResult op_graph_create(Call& call);
OpResult op_graph_destroy(Call& call);
OpResult op_graph_instantiate(Call& call);
OpResult op_graph_exec_destroy(Call& call);
OpResult op_graph_launch(Call& call);  // kGraphLaunch and kGraphUpload
OpResult op_graph_exec_update(Call& call);
OpResult op_graph_get_nodes(Call& call);
OpResult op_graph_get_edges(Call& call);
OpResult op_graph_add_kernel_node(Call& call);
OpResult op_graph_exec_kernel_node_set_params(Call& call);
OpResult op_graph_add_child_graph_node(Call& call);
OpResult op_graph_child_graph_node_get_graph(Call& call);
OpResult op_graph_node_get_type(Call& call);
OpResult op_graph_exec_child_graph_node_set_params(Call& call);
OpResult op_graph_add_memset_node(Call& call);
OpResult op_graph_add_copy_node(Call& call);
OpResult op_graph_add_empty_node(Call& call);
OpResult op_graph_add_dependencies(Call& call);
// ops/link.cpp
OpResult op_link_create(Call& call);
OpResult op_link_add(Call& call);
OpResult op_link_complete(Call& call);
OpResult op_link_destroy(Call& call);

// ops/graph_control_nodes.cpp
OpResult op_graph_conditional_handle_create(Call& call);
OpResult op_graph_add_conditional_node(Call& call);
OpResult op_graph_add_batch_mem_op_node(Call& call);
OpResult op_graph_batch_mem_op_node_set_params(Call& call);
OpResult op_graph_kernel_node_attribute(Call& call);

// ops/driver_extras.cpp
OpResult op_array_query(Call& call);
OpResult op_mem_range_handle(Call& call);
OpResult op_driver_setting(Call& call);
OpResult op_ctx_event(Call& call);
OpResult op_mipmapped_array_create(Call& call);
OpResult op_mipmapped_array_level(Call& call);
OpResult op_mipmapped_array_destroy(Call& call);

// ops/graph_nodes.cpp
OpResult op_graph_add_event_node(Call& call);
OpResult op_graph_add_host_node(Call& call);
OpResult op_graph_add_mem_alloc_node(Call& call);
OpResult op_graph_add_mem_free_node(Call& call);
OpResult op_graph_node_params(Call& call);
OpResult op_graph_destroy_node(Call& call);
OpResult op_graph_remove_dependencies(Call& call);
OpResult op_graph_clone(Call& call);
OpResult op_graph_node_find_in_clone(Call& call);
OpResult op_device_graph_mem(Call& call);
OpResult op_graph_memset_node_set_params(Call& call);
OpResult op_graph_copy_node_set_params(Call& call);
// ops/host_function.cpp
OpResult op_host_func(Call& call);

// ops/memory_pool.cpp
// ops/ipc.cpp
OpResult op_ipc_get_mem_handle(Call& call);
OpResult op_ipc_open_mem_handle(Call& call);
OpResult op_ipc_close_mem_handle(Call& call);
OpResult op_ipc_get_event_handle(Call& call);
OpResult op_ipc_open_event_handle(Call& call);
OpResult op_mem_pool_create(Call& call);
OpResult op_mem_pool_destroy(Call& call);
OpResult op_mem_pool_set_attribute(Call& call);
OpResult op_mem_pool_get_attribute(Call& call);
OpResult op_mem_pool_trim_to(Call& call);
OpResult op_mem_alloc_async(Call& call);
OpResult op_mem_free_async(Call& call);
// A cuMemAllocAsync the session waited for, tried again in the server's arena: the device
// pointer, or the error; `may_wait_more` set when the GPU had no room (not when its pool was
// destroyed or its bound reached meanwhile, or the client's limit lowered).
tl::expected<std::uint64_t, CUresult> retry_pool_allocation(Session& session,
                                                            const MemoryWait& wait,
                                                            bool& may_wait_more);

// ops/vmm.cpp
// A cuMemCreate the session waited for, tried again: the new handle's id, or the error;
// `may_wait_more` set when the driver had no room (not when the client's limit, lowered
// meanwhile, or its handle table refused it).
tl::expected<std::uint64_t, CUresult> retry_vmm_create(Session& session, const MemoryWait& wait,
                                                       bool& may_wait_more);
OpResult op_vmm_granularity(Call& call);
OpResult op_vmm_create(Call& call);
OpResult op_vmm_release(Call& call);
OpResult op_vmm_reserve(Call& call);
OpResult op_peer_export(Call& call);
OpResult op_peer_import(Call& call);
OpResult op_peer_release(Call& call);
OpResult op_vmm_export(Call& call);
OpResult op_vmm_import(Call& call);
OpResult op_vmm_share(Call& call);
OpResult op_vmm_open(Call& call);
OpResult op_vmm_close(Call& call);
OpResult op_stream_mem_op(Call& call);
OpResult op_stream_attribute(Call& call);
OpResult op_tensor_map_encode(Call& call);
OpResult op_tensor_map_replace_address(Call& call);
// A client's own green contexts (green_context.cpp).
OpResult op_green_resource(Call& call);
OpResult op_green_split(Call& call);
OpResult op_green_desc(Call& call);
OpResult op_green_ctx_create(Call& call);
// cuMemBatchDecompressAsync (decompress.cpp).
OpResult op_mem_decompress(Call& call);
// cuMemMapArrayAsync: tiles of sparse arrays (sparse_array.cpp).
OpResult op_mem_map_array(Call& call);
OpResult op_vmm_address_free(Call& call);
OpResult op_vmm_map(Call& call);
OpResult op_vmm_unmap(Call& call);
OpResult op_vmm_set_access(Call& call);
OpResult op_vmm_get_access(Call& call);
OpResult op_vmm_get_properties(Call& call);
OpResult op_vmm_retain(Call& call);

}  // namespace mpsshim::server
