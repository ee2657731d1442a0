/* Stand-in for the aws-ofi-nccl plugin: the real libnccl-net.so needs libfabric and CUDA, which this
   machine has not. The node health check loads the plugin by name as NCCL does and looks up the
   plugin interface symbol (ncclNetPlugin_v<N>); this library exports such a symbol and nothing
   else, so loading it exercises the check's loader-path and symbol logic, not NCCL. */
const char ncclNetPlugin_v8[] = "stand-in for the aws-ofi-nccl plugin";
