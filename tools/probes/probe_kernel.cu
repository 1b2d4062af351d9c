// The kernel tools/probes/graph_node_args.cpp launches: writes `value` to `*out`.
extern "C" __global__ void store_value(int* out, int value) { *out = value; }
