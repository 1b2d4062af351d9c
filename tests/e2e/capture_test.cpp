// Capture into an existing graph through the whole path on the CPU: capture_client under
// LD_PRELOAD=libmpsshim.so -> mpsshimd -> mpsshim-server -> the host-memory test driver, with
// real processes (docs/graphs.md).
#include <catch2/catch.hpp>

#include <string>

#include "harness.hpp"
#include "require_pass.hpp"

using namespace mpsshim::e2e;

namespace {

std::string client() {
  return artefact("E2E_CAPTURE_CLIENT");
}

std::string nodes_client() {
  return artefact("E2E_GRAPH_NODES_CLIENT");
}

std::string control_client() {
  return artefact("E2E_CONTROL_CLIENT");
}

std::string managed_client() {
  return artefact("E2E_MANAGED_CLIENT");
}

}  // namespace

TEST_CASE("captured work lands in the client's graph after the nodes it named, and computes",
          "[e2e][capture_to_graph]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "into_graph"}), daemon);
}

TEST_CASE(
    "a capture into a graph refuses foreign nodes, edge data, a second capture, the wrong "
    "stream; an invalidated one leaves the graph",
    "[e2e][capture_to_graph]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "errors"}), daemon);
}

TEST_CASE("a kernel captured into a graph is pointed at other buffers in the executable graph",
          "[e2e][capture_to_graph]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "update"}), daemon);
}

TEST_CASE(
    "a captured kernel nested as a child graph node computes, and the node takes another child",
    "[e2e][capture_to_graph][child_graph]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "child"}), daemon);
}

TEST_CASE(
    "event record and wait nodes order two graphs from their launch on; host nodes run at every "
    "replay; executable graphs take new events, functions and disabled nodes",
    "[e2e][graph_nodes]") {
  Daemon daemon;
  require_pass(run_client(daemon, {nodes_client(), "events_hosts"}), daemon);
}

TEST_CASE(
    "graph memory keeps its address across launches, is freed inside or outside the graph, and a "
    "graph holding it is refused what the driver refuses",
    "[e2e][graph_nodes]") {
  Daemon daemon;
  require_pass(run_client(daemon, {nodes_client(), "memory"}), daemon);
}

TEST_CASE(
    "a node destroyed, an edge removed, a clone changed apart from its original, nodes added in "
    "the generic form",
    "[e2e][graph_nodes]") {
  Daemon daemon;
  require_pass(run_client(daemon, {nodes_client(), "shape"}), daemon);
}

TEST_CASE(
    "a kernel node's own parameters change later instantiations only; the generic setters reach "
    "the setter of the node's type",
    "[e2e][graph_nodes]") {
  Daemon daemon;
  require_pass(run_client(daemon, {nodes_client(), "kernel_params"}), daemon);
}

TEST_CASE(
    "a while loop counts down, an if takes its else branch and a switch its third body; a graph "
    "with conditional nodes is refused a clone and a second instantiation",
    "[e2e][graph_nodes][control]") {
  Daemon daemon;
  require_pass(run_client(daemon, {control_client(), "conditional"}), daemon);
}

TEST_CASE(
    "batch memory operation nodes write and wait, read back and take new operations; kernel node "
    "attributes are set, read and copied",
    "[e2e][graph_nodes][control]") {
  Daemon daemon;
  require_pass(run_client(daemon, {control_client(), "batch_and_attributes"}), daemon);
}

TEST_CASE(
    "a user object's destructor runs once the program, its graphs and executable graphs let go, "
    "after the last launch",
    "[e2e][graph_nodes][control]") {
  Daemon daemon;
  require_pass(run_client(daemon, {control_client(), "user_objects"}), daemon);
}

TEST_CASE(
    "the JIT linker links data and files with logs and the wall time; a bad input fails with its "
    "reason; the linked image loads and runs",
    "[e2e][control]") {
  Daemon daemon;
  require_pass(run_client(daemon, {control_client(), "link"}), daemon);
}

TEST_CASE(
    "cuCtxRecordEvent waits for every stream of the context and holds none back; "
    "cuCtxWaitEvent holds every stream back",
    "[e2e][control][ctx_events]") {
  Daemon daemon;
  require_pass(run_client(daemon, {control_client(), "ctx_events"}), daemon);
}

TEST_CASE(
    "mipmapped arrays: levels as arrays copies reach, a texture over the whole array, the "
    "driver's rules",
    "[e2e][control][mipmapped]") {
  Daemon daemon;
  require_pass(run_client(daemon, {control_client(), "mipmapped"}), daemon);
}

TEST_CASE(
    "managed memory is host memory both processors touch, with the driver's errors, attributes "
    "and advice",
    "[e2e][control][managed]") {
  Daemon daemon;
  require_pass(run_client(daemon, {managed_client(), "managed", "1000"}), daemon);
  // Larger than a staging chunk, so copies of it take several pieces.
  require_pass(run_client(daemon, {managed_client(), "managed", "1000003"}), daemon);
}

TEST_CASE(
    "dma-buf handles, texture widths, atomic capabilities, L2 and RDMA settings and pointer "
    "attributes reach the server's driver",
    "[e2e][control]") {
  Daemon daemon({}, {{"MPSSHIM_TESTDRIVER_DEVICES", "2"}});  // a peer for the atomics query
  require_pass(run_client(daemon, {control_client(), "extras"}), daemon);
}

TEST_CASE(
    "a capture's dependency nodes are listed, replaced and added to by hand, as NCCL does, and "
    "the graph computes",
    "[e2e][capture_deps]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "capture_deps"}), daemon);
}

TEST_CASE("a client that exits while capturing into its graph leaves nothing behind",
          "[e2e][capture_to_graph]") {
  // The primary context is kept, so the driver's object count moves only with the clients.
  Daemon daemon({"--context-idle-timeout", "-1"});
  require_pass(run_client(daemon, {client(), "into_graph"}), daemon);  // the server is warm
  REQUIRE(eventually([&] { return ps_pids(daemon).empty(); }));
  const long long objects = daemon.driver_objects().at("objects");
  require_pass(run_client(daemon, {client(), "abandon"}), daemon);
  INFO("daemon log:\n" << daemon.log());
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  CHECK(eventually([&] { return daemon.driver_objects().at("objects") == objects; }));
  CHECK(daemon.log().find("1 graph") != std::string::npos);
  require_pass(run_client(daemon, {client(), "into_graph"}), daemon);
}
