# Sourced by the GPU scripts. cudarc (pinned to the CUDA 12.8 API, which CUDA 12 and 13 drivers
# both serve) loads libnvrtc/libcublas/libcublasLt by their unversioned or ".so.12" names. A
# machine with only CUDA 13 libraries (".so.13", e.g. PyTorch's wheels) gets unversioned links
# to them in a private directory on LD_LIBRARY_PATH.
hive_cuda_libs() {
  local dir=/tmp/hive-gpu-cuda-libs lib found
  mkdir -p "$dir"
  for lib in libnvrtc libcublas libcublasLt; do
    if ldconfig -p | grep -q "$lib\.so "; then continue; fi
    found=$( { ldconfig -p | awk -v l="$lib" '$1 ~ "^"l"\\.so\\.[0-9]+$" {print $NF}';
               find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /opt /usr/lib /usr/local/lib -maxdepth 8 \
                 -name "$lib.so.[0-9]*" 2>/dev/null; } | grep -v alt | sort -V | tail -1)
    [ -n "$found" ] && ln -sf "$found" "$dir/$lib.so"
  done
  # NVRTC finds its builtins library next to itself.
  export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
hive_cuda_libs
