// Reductions over the trailing dimensions of a (permuted) layout: output element o
// reduces the `lane` elements with linear indices o*lane .. o*lane+lane-1. One
// block of threads per output element (grid-stride over outputs); partial results
// meet through warp shuffles and shared memory.

// Reduction codes (mirror `ReduceCode` in backend/cuda/ops.rs).
#define R_SUM 0
#define R_MEAN 1
#define R_MAX 2
#define R_MIN 3
#define R_ARGMAX 4
#define R_ARGMIN 5
#define R_VAR 6

#define REDUCE_THREADS 256

template <typename A> __device__ __forceinline__ A shfl_down(A v, int d) {
    return __shfl_down_sync(0xffffffffu, v, d);
}

// Sum of `v` over the block; the result is valid in thread 0.
template <typename A> __device__ __forceinline__ A block_sum(A v, A* shared) {
    for (int d = 16; d > 0; d >>= 1) v += shfl_down(v, d);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) / 32;
    v = threadIdx.x < nwarps ? shared[threadIdx.x] : (A)0;
    if (warp == 0)
        for (int d = 16; d > 0; d >>= 1) v += shfl_down(v, d);
    return v;
}

// Is (a, ia) a better pick than (b, ib) for max (want_max) or min? NaN wins, like
// PyTorch's; ties go to the smaller index.
template <typename A> __device__ __forceinline__ bool better(A a, i64 ia, A b, i64 ib, bool want_max) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    bool na = is_nan(a), nb = is_nan(b);
    if (na || nb) return na && (!nb || ia < ib);
    if (a == b) return ia < ib;
    return want_max ? a > b : a < b;
}

// Block-wide best (value, index); valid in thread 0.
template <typename A>
__device__ __forceinline__ void block_best(A& v, i64& idx, bool want_max, A* sv, i64* si) {
    for (int d = 16; d > 0; d >>= 1) {
        A ov = shfl_down(v, d);
        i64 oi = __shfl_down_sync(0xffffffffu, idx, d);
        if (better(ov, oi, v, idx, want_max)) { v = ov; idx = oi; }
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) { sv[warp] = v; si[warp] = idx; }
    __syncthreads();
    int nwarps = (blockDim.x + 31) / 32;
    if (threadIdx.x < nwarps) { v = sv[threadIdx.x]; idx = si[threadIdx.x]; } else { idx = -1; }
    if (warp == 0)
        for (int d = 16; d > 0; d >>= 1) {
            A ov = shfl_down(v, d);
            i64 oi = __shfl_down_sync(0xffffffffu, idx, d);
            if (better(ov, oi, v, idx, want_max)) { v = ov; idx = oi; }
        }
}

// T: input dtype, O: output dtype. Sums of integers accumulate in i64; floats in
// float (f16, bf16, f32) or double (f64).
template <typename T, typename O>
__device__ void reduce_impl(const T* x, Layout lx, O* out, i64 n_out, i64 lane, int op, double correction) {
    typedef decltype(widen(x[0])) A;
    __shared__ A sv[32];
    __shared__ i64 si[32];
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        i64 base = o * lane;
        if (op == R_SUM || op == R_MEAN || op == R_VAR) {
            A s = (A)0;
            for (i64 j = threadIdx.x; j < lane; j += blockDim.x) s += widen(x[loc(lx, base + j)]);
            s = block_sum(s, sv);
            if (op == R_VAR) {
                __shared__ A mean_s;
                if (threadIdx.x == 0) mean_s = s / (A)lane;
                __syncthreads();
                A m = mean_s, q = (A)0;
                for (i64 j = threadIdx.x; j < lane; j += blockDim.x) {
                    A d = widen(x[loc(lx, base + j)]) - m;
                    q += d * d;
                }
                q = block_sum(q, sv);
                if (threadIdx.x == 0) {
                    double dof = (double)lane - correction;
                    out[o] = narrow<O>(dof > 0 ? q / (A)dof : (A)__longlong_as_double(0x7ff8000000000000ll));
                }
            } else if (threadIdx.x == 0) {
                out[o] = narrow<O>(op == R_MEAN ? s / (A)lane : s);
            }
        } else {
            bool want_max = (op == R_MAX || op == R_ARGMAX);
            A best = (A)0;
            i64 bi = -1;
            for (i64 j = threadIdx.x; j < lane; j += blockDim.x) {
                A v = widen(x[loc(lx, base + j)]);
                if (better(v, j, best, bi, want_max)) { best = v; bi = j; }
            }
            block_best(best, bi, want_max, sv, si);
            if (threadIdx.x == 0) {
                if (op == R_ARGMAX || op == R_ARGMIN) out[o] = narrow<O>(bi);
                else out[o] = narrow<O>(best);
            }
        }
        __syncthreads();
    }
}

// reduce_<T>: value reductions keeping the dtype (sum/mean/var of floats, max/min
// of everything); reduce_<T>_i64: integer sums and arg-reductions.
#define REDUCE(T, S)                                                                                 \
    extern "C" __global__ void reduce_##S(const T* x, Layout lx, T* out, i64 n_out, i64 lane,       \
                                          int op, double correction) {                               \
        reduce_impl<T, T>(x, lx, out, n_out, lane, op, correction);                                  \
    }                                                                                                \
    extern "C" __global__ void reduce_##S##_i64(const T* x, Layout lx, i64* out, i64 n_out,         \
                                                i64 lane, int op, double correction) {               \
        reduce_impl<T, i64>(x, lx, out, n_out, lane, op, correction);                                \
    }
EMBER_ALL_TYPES(REDUCE)

// Softmax (or log-softmax) over contiguous rows of length `cols`; one block per row.
template <typename T>
__device__ void softmax_impl(const T* x, T* out, i64 rows, i64 cols, int is_log) {
    typedef decltype(widen(x[0])) A;
    __shared__ A sv[32];
    __shared__ i64 si[32];
    __shared__ A row_max, row_sum;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        T* yr = out + r * cols;
        A m = (A)0;
        i64 mi = -1;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            A v = widen(xr[j]);
            if (better(v, j, m, mi, true)) { m = v; mi = j; }
        }
        block_best(m, mi, true, sv, si);
        if (threadIdx.x == 0) row_max = m;
        __syncthreads();
        m = row_max;
        A s = (A)0;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) s += exp(widen(xr[j]) - m);
        s = block_sum(s, sv);
        if (threadIdx.x == 0) row_sum = s;
        __syncthreads();
        s = row_sum;
        A lse = log(s);
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            A d = widen(xr[j]) - m;
            yr[j] = narrow<T>(is_log ? d - lse : exp(d) / s);
        }
        __syncthreads();
    }
}

#define SOFTMAX(T, S)                                                                                \
    extern "C" __global__ void softmax_##S(const T* x, T* out, i64 rows, i64 cols, int is_log) {    \
        softmax_impl(x, out, rows, cols, is_log);                                                    \
    }
EMBER_FLOAT_TYPES(SOFTMAX)
