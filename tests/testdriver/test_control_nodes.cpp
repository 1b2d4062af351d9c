// Conditional nodes, batch memory operation nodes, kernel node attributes and the JIT linker in
// the test driver, held to what the real driver does (cuda.h; docs/graphs.md and
// docs/cuda-runtime.md give what was measured on an H200).
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

int read_int(Session& s, CUdeviceptr p) {
  int v = 0;
  REQUIRE_CU(s.sut.cuMemcpyDtoHAsync_v2(&v, p, sizeof v, s.stream));
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));
  return v;
}

void set_now(Session& s, CUdeviceptr p, unsigned value, std::size_t count) {
  REQUIRE_CU(s.sut.cuMemsetD32Async(p, value, count, s.stream));
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));
}

CUgraphNode set_int(Session& s, CUgraph g, CUdeviceptr p, unsigned value,
                    std::vector<CUgraphNode> deps = {}) {
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = p;
  m.value = value;
  m.elementSize = 4;
  m.width = 1;
  m.height = 1;
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemsetNode(&node, g, deps.data(), deps.size(), &m, s.green_ctx));
  return node;
}

CUgraphNode kernel(Session& s, CUgraph g, const char* name, void** args,
                   std::vector<CUgraphNode> deps = {}) {
  CUDA_KERNEL_NODE_PARAMS k{};
  k.func = s.function(name);
  k.gridDimX = k.gridDimY = k.gridDimZ = 1;
  k.blockDimX = 32;
  k.blockDimY = k.blockDimZ = 1;
  k.kernelParams = args;
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddKernelNode_v2(&node, g, deps.data(), deps.size(), &k));
  return node;
}

CUresult add_conditional(Session& s, CUgraph g, CUgraphConditionalHandle h,
                         CUgraphConditionalNodeType type, unsigned size,
                         std::vector<CUgraphNode> deps, std::vector<CUgraph>& bodies) {
  CUgraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = size;
  CUgraphNode node = nullptr;
  CUresult r = s.sut.cuGraphAddNode_v2(&node, g, deps.data(), nullptr, deps.size(), &p);
  if (r == CUDA_SUCCESS) bodies.assign(p.conditional.phGraph_out, p.conditional.phGraph_out + size);
  return r;
}

TEST_CASE("a while node loops until a kernel clears its handle; defaults apply at every launch",
          "[graph][control]") {
  Session s;
  CUdeviceptr data = s.alloc(sizeof(int));
  CUdeviceptr counter = s.alloc(sizeof(int));
  set_now(s, data, 0, 1);
  CUgraph g = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&g, 0));
  CUgraphConditionalHandle h = 0;
  REQUIRE_CU(
      s.sut.cuGraphConditionalHandleCreate(&h, g, s.green_ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
  const CUgraphNode start = set_int(s, g, counter, 4);
  std::vector<CUgraph> body;
  REQUIRE_CU(add_conditional(s, g, h, CU_GRAPH_COND_TYPE_WHILE, 1, {start}, body));
  int n = 1;
  void* inc[] = {&data, &n};
  void* down[] = {&h, &counter};
  const CUgraphNode step = kernel(s, body[0], "increment_i32", inc);
  kernel(s, body[0], "countdown", down, {step});
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, g, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));
  CHECK(read_int(s, data) == 8);
  CHECK(read_int(s, counter) == 0);
  // What a graph with conditional nodes may not do (cuda.h).
  CUgraph clone = nullptr;
  CHECK_CU(s.sut.cuGraphClone(&clone, g), CUDA_ERROR_NOT_SUPPORTED);
  CUgraphExec second = nullptr;
  CHECK_CU(s.sut.cuGraphInstantiateWithFlags(&second, g, 0), CUDA_ERROR_NOT_SUPPORTED);
  CUgraph parent = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&parent, 0));
  CUgraphNode child = nullptr;
  CHECK_CU(s.sut.cuGraphAddChildGraphNode(&child, parent, nullptr, 0, g), CUDA_ERROR_NOT_SUPPORTED);
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(parent));
  REQUIRE_CU(s.sut.cuGraphDestroy(g));
}

TEST_CASE(
    "if and switch nodes pick their body by the handle's value; a handle of another graph "
    "and a wrong body count are refused",
    "[graph][control]") {
  Session s;
  const CUdeviceptr x = s.alloc(sizeof(int));
  const CUdeviceptr y = s.alloc(sizeof(int));
  CUgraph g = nullptr, other = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&g, 0));
  REQUIRE_CU(s.sut.cuGraphCreate(&other, 0));
  CUgraphConditionalHandle choose = 0, pick = 0, foreign = 0;
  REQUIRE_CU(s.sut.cuGraphConditionalHandleCreate(&choose, g, s.green_ctx, 0,
                                                  CU_GRAPH_COND_ASSIGN_DEFAULT));
  REQUIRE_CU(
      s.sut.cuGraphConditionalHandleCreate(&pick, g, s.green_ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
  REQUIRE_CU(s.sut.cuGraphConditionalHandleCreate(&foreign, other, s.green_ctx, 0, 0));
  std::vector<CUgraph> bodies;
  CHECK_CU(add_conditional(s, g, foreign, CU_GRAPH_COND_TYPE_IF, 1, {}, bodies),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(add_conditional(s, g, choose, CU_GRAPH_COND_TYPE_IF, 3, {}, bodies),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(add_conditional(s, g, choose, CU_GRAPH_COND_TYPE_WHILE, 2, {}, bodies),
           CUDA_ERROR_INVALID_VALUE);
  std::vector<CUgraph> branches;
  REQUIRE_CU(add_conditional(s, g, choose, CU_GRAPH_COND_TYPE_IF, 2, {}, branches));
  set_int(s, branches[0], x, 1);
  set_int(s, branches[1], x, 2);
  std::vector<CUgraph> cases;
  REQUIRE_CU(add_conditional(s, g, pick, CU_GRAPH_COND_TYPE_SWITCH, 3, {}, cases));
  for (unsigned i = 0; i < 3; ++i) set_int(s, cases[i], y, 10 + i);
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, g, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));
  CHECK(read_int(s, x) == 2);   // the else branch
  CHECK(read_int(s, y) == 11);  // body 1
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(g));
  REQUIRE_CU(s.sut.cuGraphDestroy(other));
}

TEST_CASE(
    "a batch memory operation node writes and waits in graph order; executable graphs and "
    "the node take new operations; unreachable memory is refused",
    "[graph][control]") {
  Session s;
  const CUdeviceptr flag = s.alloc(8);
  set_now(s, flag, 0, 2);
  CUgraph g = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&g, 0));
  CUstreamBatchMemOpParams ops[2]{};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = flag;
  ops[0].writeValue.value = 7;
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = flag;
  ops[1].waitValue.value = 7;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  CUDA_BATCH_MEM_OP_NODE_PARAMS p{s.green_ctx, 2, ops, 0};
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddBatchMemOpNode(&node, g, nullptr, 0, &p));
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, g, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));
  CHECK(read_int(s, flag) == 7);
  ops[0].writeValue.value = 9;
  p.count = 1;
  REQUIRE_CU(s.sut.cuGraphExecBatchMemOpNodeSetParams(exec, node, &p));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));
  CHECK(read_int(s, flag) == 9);
  int on_stack = 0;
  ops[0].writeValue.address = reinterpret_cast<CUdeviceptr>(&on_stack);
  CHECK_CU(s.sut.cuGraphBatchMemOpNodeSetParams(node, &p), CUDA_ERROR_INVALID_VALUE);
  CUgraphNode refused = nullptr;
  p.flags = 1;
  CHECK_CU(s.sut.cuGraphAddBatchMemOpNode(&refused, g, nullptr, 0, &p), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(g));
}

TEST_CASE("kernel node attributes are kept per node and copied; other nodes have none",
          "[graph][control]") {
  Session s;
  CUdeviceptr data = s.alloc(sizeof(int));
  CUgraph g = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&g, 0));
  int n = 1;
  void* args[] = {&data, &n};
  const CUgraphNode a = kernel(s, g, "increment_i32", args);
  const CUgraphNode b = kernel(s, g, "increment_i32", args);
  CUgraphNode empty = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddEmptyNode(&empty, g, nullptr, 0));
  CUkernelNodeAttrValue v{};
  v.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  REQUIRE_CU(s.sut.cuGraphKernelNodeSetAttribute(a, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &v));
  CUkernelNodeAttrValue got{};
  REQUIRE_CU(s.sut.cuGraphKernelNodeGetAttribute(b, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &got));
  CHECK(got.memSyncDomain == CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT);
  REQUIRE_CU(s.sut.cuGraphKernelNodeCopyAttributes(b, a));
  REQUIRE_CU(s.sut.cuGraphKernelNodeGetAttribute(b, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &got));
  CHECK(got.memSyncDomain == CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE);
  CHECK_CU(s.sut.cuGraphKernelNodeGetAttribute(empty, CU_LAUNCH_ATTRIBUTE_PRIORITY, &got),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphDestroy(g));
}

TEST_CASE(
    "the JIT linker fills the caller's logs and wall time, refuses bad PTX with the reason, "
    "and its image loads",
    "[control][link]") {
  Session s;
  char info[256] = {}, error[256] = {};
  CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_WALL_TIME};
  void* values[] = {info, reinterpret_cast<void*>(std::uintptr_t{sizeof info}), error,
                    reinterpret_cast<void*>(std::uintptr_t{sizeof error}), nullptr};
  CUlinkState link = nullptr;
  REQUIRE_CU(s.sut.cuLinkCreate_v2(5, options, values, &link));
  void* image = nullptr;
  size_t bytes = 0;
  std::string ptx = ".version 9.0\n.target sm_90\n";
  REQUIRE_CU(s.sut.cuLinkAddData_v2(link, CU_JIT_INPUT_PTX, ptx.data(), ptx.size() + 1, "a.ptx", 0,
                                    nullptr, nullptr));
  CHECK(std::string(info).find("a.ptx") != std::string::npos);
  std::string bad = ".version 9.0\nsyntax error\n";
  CHECK_CU(s.sut.cuLinkAddData_v2(link, CU_JIT_INPUT_PTX, bad.data(), bad.size() + 1, "bad.ptx", 0,
                                  nullptr, nullptr),
           CUDA_ERROR_INVALID_PTX);
  CHECK(std::string(error).find("bad.ptx") != std::string::npos);
  CHECK_CU(
      s.sut.cuLinkAddFile_v2(link, CU_JIT_INPUT_PTX, "/nonexistent/x.ptx", 0, nullptr, nullptr),
      CUDA_ERROR_FILE_NOT_FOUND);
  REQUIRE_CU(s.sut.cuLinkComplete(link, &image, &bytes));
  float wall = 0;
  std::memcpy(&wall, &values[4], sizeof wall);
  CHECK(wall > 0);
  CUmodule module = nullptr;
  REQUIRE_CU(s.sut.cuModuleLoadData(&module, image));
  REQUIRE_CU(s.sut.cuModuleUnload(module));
  REQUIRE_CU(s.sut.cuLinkDestroy(link));
}

}  // namespace
}  // namespace mpsshim::testdriver::test
