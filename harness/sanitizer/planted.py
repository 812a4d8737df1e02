"""Small CUDA kernels with one planted bug each, and their fixed twins: the sanitizer's positive controls.

A sanitizer run that reports nothing proves little unless the same wrapper, on the same machine, is
seen to report a bug it must find. Each planted kernel has exactly one bug of the kind one tool
finds; the fixed twin is the same kernel without it. Compiled with NVRTC through cupy, with line
info so findings carry file:line.
"""

from __future__ import annotations

SOURCE = r"""
extern "C" __global__ void planted_race(float* out) {
    __shared__ float buf[256];
    int t = threadIdx.x;
    buf[t] = (float)t;
#ifdef FIXED
    __syncthreads();
#endif
    out[t] = buf[(t + 32) % blockDim.x];  // another warp's slot: a read-after-write hazard without the barrier
}

extern "C" __global__ void planted_oob(float* out, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
#ifdef FIXED
    if (t < n) out[t] = 1.0f;
#else
    if (t <= n) out[t] = 1.0f;  // off by one: thread n writes one element past the end
#endif
}

extern "C" __global__ void planted_uninit(const float* in, float* out, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) out[t] = in[t] * 2.0f;  // `in` is written by the host first only in the fixed twin
}

extern "C" __global__ void planted_barrier(float* out) {
    __shared__ float buf[64];
    int t = threadIdx.x;
    buf[t] = (float)t;
#ifdef FIXED
    __syncthreads();
#else
    if (t < 16) __syncthreads();  // a barrier only part of the block reaches
#endif
    out[t] = buf[t];
}
"""

KERNELS = ("planted_race", "planted_oob", "planted_uninit", "planted_barrier")
N = 256


def run(bug: str | None) -> list[str]:
    """Launch the kernel with the planted bug `bug` (or every fixed twin when None); names launched.

    cupy's memory pool is switched off so every buffer is its own allocation, as PyTorch's caching
    allocator is for memcheck: an out-of-bounds write then leaves the allocation instead of landing
    in pool memory.
    """
    import cupy
    import numpy

    cupy.cuda.set_allocator(None)
    options = ("-lineinfo",) + (("-DFIXED",) if bug is None else ())
    module = cupy.RawModule(code=SOURCE, options=options)
    wanted = KERNELS if bug is None else (bug,)
    out = cupy.zeros(N, dtype=cupy.float32)
    for name in wanted:
        kernel = module.get_function(name)
        if name == "planted_race":
            kernel((1,), (N,), (out,))
        elif name == "planted_oob":
            small = cupy.zeros(N - 1, dtype=cupy.float32)
            kernel((1,), (N,), (small, cupy.int32(N - 1)))  # the bug writes small[N - 1], past its end
        elif name == "planted_uninit":
            # Written by a host copy, not a kernel: a kernel-name filter leaves other kernels' writes unseen.
            src = cupy.asarray(numpy.ones(N, dtype=numpy.float32)) if bug is None else cupy.empty(N, dtype=cupy.float32)
            kernel((1,), (N,), (src, out, cupy.int32(N)))
        else:
            kernel((1,), (64,), (out,))
    return list(wanted)
