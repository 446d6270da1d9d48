// Reductions over the trailing dimensions of a (permuted) layout: output element o
// reduces the `lane` elements with linear indices o*lane .. o*lane+lane-1. Three
// shapes of work (backend/cuda/ops/reduce.rs picks one):
// - reduce_<T>: one block of threads per output (grid-stride over outputs);
//   partial results meet through warp shuffles and shared memory;
// - reduce_warp_<T>: one warp per output, for short lanes, where a block would
//   leave most of its threads idle;
// - reduce_partial_<T> then reduce_finish_<T>: few outputs over long lanes (a
//   full sum): each lane is cut into `splits` chunks reduced by separate blocks
//   into partials (value, index or count, and M2 for the variance), which a second
//   kernel combines, so that every multiprocessor takes part;
// - col_sum_<T>: sums and means over the leading dims of a contiguous array (a
//   bias gradient, a mean over the batch), read across the columns so that
//   neighbouring threads read neighbouring values.

// The reduction codes R_* are defined in front of this file when it is compiled,
// from the tables of ember's op vocabulary (backend/op).

#define REDUCE_THREADS 256

template <typename A> __device__ __forceinline__ A shfl_down(A v, int d) {
    return __shfl_down_sync(0xffffffffu, v, d);
}

// Sum over the warp; every lane gets the result.
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

// Sum of `v` over the block; the result is valid in thread 0.
template <typename A> __device__ __forceinline__ A block_sum(A v, A* shared) {
    v = warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) / 32;
    v = threadIdx.x < nwarps ? shared[threadIdx.x] : (A)0;
    if (warp == 0) v = warp_sum(v);
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

// The unbiased-by-`correction` variance (R_VAR) or its square root (R_STD) from
// the sum of squared deviations `q` of `lane` values; NaN when there are no degrees
// of freedom left (PyTorch's). Variances accumulate in double for every float
// dtype: the squares of f32 values near 1e30 overflow a float, and the standard
// deviation is taken before narrowing, so it stays finite where the variance is not.
__device__ __forceinline__ double variance(double q, i64 lane, double correction, int op) {
    double dof = (double)lane - correction;
    double v = dof > 0 ? q / dof : __longlong_as_double(0x7ff8000000000000ll);
    return op == R_STD ? sqrt(v) : v;
}

__device__ __forceinline__ bool is_var(int op) { return op == R_VAR || op == R_STD; }

// What a max/min/argmax/argmin writes: the best value, or its index.
template <typename O, typename A> __device__ __forceinline__ O best_out(int op, A best, i64 bi) {
    return (op == R_ARGMAX || op == R_ARGMIN) ? narrow<O>(bi) : narrow<O>(best);
}

// Warp-wide best (value, index); valid in lane 0.
template <typename A> __device__ __forceinline__ void warp_best(A& v, i64& idx, bool want_max) {
    for (int d = 16; d > 0; d >>= 1) {
        A ov = shfl_down(v, d);
        i64 oi = __shfl_down_sync(0xffffffffu, idx, d);
        if (better(ov, oi, v, idx, want_max)) { v = ov; idx = oi; }
    }
}

// Block-wide best (value, index); valid in thread 0.
template <typename A>
__device__ __forceinline__ void block_best(A& v, i64& idx, bool want_max, A* sv, i64* si) {
    warp_best(v, idx, want_max);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) { sv[warp] = v; si[warp] = idx; }
    __syncthreads();
    int nwarps = (blockDim.x + 31) / 32;
    if (threadIdx.x < nwarps) { v = sv[threadIdx.x]; idx = si[threadIdx.x]; } else { idx = -1; }
    if (warp == 0) warp_best(v, idx, want_max);
}

// This thread's share of the sum of lane elements lo..hi of the lane at `base`:
// elements lo + threadIdx.x, then every blockDim.x. Four independent accumulators
// keep four loads in flight per thread (one add waiting on each load left the
// memory system idle: a full sum of 4096x4096 floats ran at 30% of copy bandwidth
// on an H200), and a contiguous layout skips loc's test in the loop.
template <typename T, typename A>
__device__ __forceinline__ A thread_sum(const T* x, const Layout& lx, i64 base, i64 lo, i64 hi) {
    A s0 = (A)0, s1 = (A)0, s2 = (A)0, s3 = (A)0;
    i64 step = blockDim.x, j = lo + threadIdx.x;
    if (lx.contiguous) {
        const T* p = x + lx.offset + base;
        for (; j + 3 * step < hi; j += 4 * step) {
            s0 += widen(p[j]);
            s1 += widen(p[j + step]);
            s2 += widen(p[j + 2 * step]);
            s3 += widen(p[j + 3 * step]);
        }
        for (; j < hi; j += step) s0 += widen(p[j]);
    } else {
        for (; j < hi; j += step) s0 += widen(x[loc(lx, base + j)]);
    }
    return (s0 + s1) + (s2 + s3);
}

// T: input dtype, O: output dtype. Sums of integers accumulate in i64; floats in
// float (f16, bf16, f32) or double (f64).
template <typename T, typename O>
__device__ void reduce_impl(const T* x, Layout lx, O* out, i64 n_out, i64 lane, int op, double correction) {
    typedef decltype(widen(x[0])) A;
    __shared__ A sv[32];
    __shared__ i64 si[32];
    __shared__ double sd[32];
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        i64 base = o * lane;
        if (is_var(op)) {
            double s = 0;
            for (i64 j = threadIdx.x; j < lane; j += blockDim.x) s += (double)widen(x[loc(lx, base + j)]);
            s = block_sum(s, sd);
            __shared__ double mean_s;
            if (threadIdx.x == 0) mean_s = s / (double)lane;
            __syncthreads();
            double m = mean_s, q = 0;
            for (i64 j = threadIdx.x; j < lane; j += blockDim.x) {
                double d = (double)widen(x[loc(lx, base + j)]) - m;
                q += d * d;
            }
            q = block_sum(q, sd);
            if (threadIdx.x == 0) out[o] = narrow<O>((A)variance(q, lane, correction, op));
        } else if (op == R_SUM || op == R_MEAN) {
            A s = block_sum(thread_sum<T, A>(x, lx, base, 0, lane), sv);
            if (threadIdx.x == 0) {
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
            if (threadIdx.x == 0) out[o] = best_out<O>(op, best, bi);
        }
        __syncthreads();
    }
}

// One warp per output. Every lane of a warp walks the same outputs, so the warp
// stays whole at each shuffle.
template <typename T, typename O>
__device__ void reduce_warp_impl(const T* x, Layout lx, O* out, i64 n_out, i64 lane, int op, double correction) {
    typedef typename acc_t<T>::type A;
    int l = threadIdx.x % 32;
    i64 warps = (i64)gridDim.x * (blockDim.x / 32);
    for (i64 o = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; o < n_out; o += warps) {
        i64 base = o * lane;
        if (is_var(op)) {
            double s = 0;
            for (i64 j = l; j < lane; j += 32) s += (double)widen(x[loc(lx, base + j)]);
            s = warp_sum(s);
            double m = s / (double)lane, q = 0;
            for (i64 j = l; j < lane; j += 32) {
                double d = (double)widen(x[loc(lx, base + j)]) - m;
                q += d * d;
            }
            q = warp_sum(q);
            if (l == 0) out[o] = narrow<O>((A)variance(q, lane, correction, op));
        } else if (op == R_SUM || op == R_MEAN) {
            A s = (A)0;
            for (i64 j = l; j < lane; j += 32) s += widen(x[loc(lx, base + j)]);
            s = warp_sum(s);
            if (l == 0) {
                out[o] = narrow<O>(op == R_MEAN ? s / (A)lane : s);
            }
        } else {
            bool want_max = (op == R_MAX || op == R_ARGMAX);
            A best = (A)0;
            i64 bi = -1;
            for (i64 j = l; j < lane; j += 32) {
                A v = widen(x[loc(lx, base + j)]);
                if (better(v, j, best, bi, want_max)) { best = v; bi = j; }
            }
            warp_best(best, bi, want_max);
            if (l == 0) out[o] = best_out<O>(op, best, bi);
        }
    }
}

// Partials: block b = o * splits + s reduces chunk s of output o's lane into slot
// b: pv the sum, the best value or (variance) the chunk's mean; pi the best's index
// in the lane or (variance) the chunk's count; pm (variance only) the chunk's root
// mean square deviation sqrt(M2 / count), which a float holds where M2 overflows.
template <typename T>
__device__ void reduce_partial_impl(const T* x, Layout lx, i64 n_out, i64 lane, i64 splits, int op,
                                    typename acc_t<T>::type* pv, i64* pi, typename acc_t<T>::type* pm) {
    typedef typename acc_t<T>::type A;
    __shared__ A sv[32];
    __shared__ i64 si[32];
    __shared__ double sd[32];
    __shared__ double mean_s;
    i64 chunk = (lane + splits - 1) / splits;
    for (i64 b = blockIdx.x; b < n_out * splits; b += gridDim.x) {
        i64 o = b / splits, lo = (b % splits) * chunk;
        i64 hi = lo + chunk < lane ? lo + chunk : lane;
        i64 base = o * lane;
        if (is_var(op)) {
            double s = 0;
            for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) s += (double)widen(x[loc(lx, base + j)]);
            s = block_sum(s, sd);
            i64 count = hi > lo ? hi - lo : 0;
            if (threadIdx.x == 0) mean_s = count > 0 ? s / (double)count : 0.0;
            __syncthreads();
            double m = mean_s, q = 0;
            for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
                double d = (double)widen(x[loc(lx, base + j)]) - m;
                q += d * d;
            }
            q = block_sum(q, sd);
            if (threadIdx.x == 0) {
                pv[b] = (A)m;
                pi[b] = count;
                pm[b] = (A)(count > 0 ? sqrt(q / (double)count) : 0.0);
            }
        } else if (op == R_SUM || op == R_MEAN) {
            A s = block_sum(thread_sum<T, A>(x, lx, base, lo, hi), sv);
            if (threadIdx.x == 0) {
                pv[b] = s;
            }
        } else {
            bool want_max = (op == R_MAX || op == R_ARGMAX);
            A best = (A)0;
            i64 bi = -1;
            for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
                A v = widen(x[loc(lx, base + j)]);
                if (better(v, j, best, bi, want_max)) { best = v; bi = j; }
            }
            block_best(best, bi, want_max, sv, si);
            if (threadIdx.x == 0) { pv[b] = best; pi[b] = bi; }
        }
        __syncthreads();
    }
}

// Combines each output's `splits` partials (one block per output). The variance
// joins chunks exactly, in double: the mean is the count-weighted mean of the
// chunks' means, and M2 = sum of (count_s * rms_s^2 + count_s * (mean_s - mean)^2).
template <typename T, typename O>
__device__ void reduce_finish_impl(const typename acc_t<T>::type* pv, const i64* pi,
                                   const typename acc_t<T>::type* pm, O* out, i64 n_out, i64 lane,
                                   i64 splits, int op, double correction) {
    typedef typename acc_t<T>::type A;
    __shared__ A sv[32];
    __shared__ i64 si[32];
    __shared__ double sd[32];
    __shared__ double mean_s;
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        i64 base = o * splits;
        if (op == R_SUM || op == R_MEAN) {
            A s = (A)0;
            for (i64 t = threadIdx.x; t < splits; t += blockDim.x) s += pv[base + t];
            s = block_sum(s, sv);
            if (threadIdx.x == 0) out[o] = narrow<O>(op == R_MEAN ? s / (A)lane : s);
        } else if (is_var(op)) {
            double s = 0;
            for (i64 t = threadIdx.x; t < splits; t += blockDim.x) s += (double)pv[base + t] * (double)pi[base + t];
            s = block_sum(s, sd);
            if (threadIdx.x == 0) mean_s = s / (double)lane;
            __syncthreads();
            double m = mean_s, q = 0;
            for (i64 t = threadIdx.x; t < splits; t += blockDim.x) {
                double d = (double)pv[base + t] - m, r = (double)pm[base + t], c = (double)pi[base + t];
                q += c * r * r + c * d * d;
            }
            q = block_sum(q, sd);
            if (threadIdx.x == 0) out[o] = narrow<O>((A)variance(q, lane, correction, op));
        } else {
            bool want_max = (op == R_MAX || op == R_ARGMAX);
            A best = (A)0;
            i64 bi = -1;
            for (i64 t = threadIdx.x; t < splits; t += blockDim.x)
                if (better(pv[base + t], pi[base + t], best, bi, want_max)) { best = pv[base + t]; bi = pi[base + t]; }
            block_best(best, bi, want_max, sv, si);
            if (threadIdx.x == 0) out[o] = best_out<O>(op, best, bi);
        }
        __syncthreads();
    }
}

// reduce_<T>: value reductions keeping the dtype (sum/mean/var of floats, max/min
// of everything); reduce_<T>_i64: integer sums and arg-reductions. Likewise for the
// warp-per-output and finishing kernels.
#define REDUCE(T, S)                                                                                 \
    extern "C" __global__ void reduce_##S(const T* x, Layout lx, T* out, i64 n_out, i64 lane,       \
                                          int op, double correction) {                               \
        reduce_impl<T, T>(x, lx, out, n_out, lane, op, correction);                                  \
    }                                                                                                \
    extern "C" __global__ void reduce_##S##_i64(const T* x, Layout lx, i64* out, i64 n_out,         \
                                                i64 lane, int op, double correction) {               \
        reduce_impl<T, i64>(x, lx, out, n_out, lane, op, correction);                                \
    }                                                                                                \
    extern "C" __global__ void reduce_warp_##S(const T* x, Layout lx, T* out, i64 n_out, i64 lane,  \
                                               int op, double correction) {                          \
        reduce_warp_impl<T, T>(x, lx, out, n_out, lane, op, correction);                             \
    }                                                                                                \
    extern "C" __global__ void reduce_warp_##S##_i64(const T* x, Layout lx, i64* out, i64 n_out,    \
                                                     i64 lane, int op, double correction) {          \
        reduce_warp_impl<T, i64>(x, lx, out, n_out, lane, op, correction);                           \
    }                                                                                                \
    extern "C" __global__ void reduce_partial_##S(const T* x, Layout lx, i64 n_out, i64 lane,       \
                                                  i64 splits, int op, acc_t<T>::type* pv, i64* pi,   \
                                                  acc_t<T>::type* pm) {                              \
        reduce_partial_impl<T>(x, lx, n_out, lane, splits, op, pv, pi, pm);                          \
    }                                                                                                \
    extern "C" __global__ void reduce_finish_##S(const acc_t<T>::type* pv, const i64* pi,           \
                                                 const acc_t<T>::type* pm, T* out, i64 n_out,        \
                                                 i64 lane, i64 splits, int op, double correction) {  \
        reduce_finish_impl<T, T>(pv, pi, pm, out, n_out, lane, splits, op, correction);              \
    }                                                                                                \
    extern "C" __global__ void reduce_finish_##S##_i64(const acc_t<T>::type* pv, const i64* pi,     \
                                                       const acc_t<T>::type* pm, i64* out,           \
                                                       i64 n_out, i64 lane, i64 splits, int op,      \
                                                       double correction) {                          \
        reduce_finish_impl<T, i64>(pv, pi, pm, out, n_out, lane, splits, op, correction);            \
    }
EMBER_ALL_TYPES(REDUCE)

// Column sums: x is a contiguous [rows, cols] array (a reduction over leading
// dims), out[y * cols + c] = (sum over this block row's share of rows of
// x[r * cols + c]) / divisor. Blocks are 32 columns x blockDim.y row slices (8, or
// as many as there are rows when fewer: a convolution's per-sample weight
// gradients of a few samples): a warp reads 32 neighbouring values (coalesced), and
// blockIdx.y splits the rows when there are too few column tiles to fill the GPU
// (each y then writes a row of partials, summed by a second launch of the A -> O
// instance).
#define COL_W 32
#define COL_H 8
template <typename T, typename O>
__device__ void col_sum_impl(const T* x, O* out, i64 rows, i64 cols, double divisor) {
    typedef typename acc_t<T>::type A;
    __shared__ A part[COL_H][COL_W + 1];
    i64 c = (i64)blockIdx.x * COL_W + threadIdx.x;
    A s = (A)0;
    if (c < cols)
        for (i64 r = (i64)blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += (i64)gridDim.y * blockDim.y)
            s += widen(x[r * cols + c]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        for (int k = 1; k < (int)blockDim.y; ++k) s += part[k][threadIdx.x];
        out[(i64)blockIdx.y * cols + c] = narrow<O>(divisor == 1.0 ? s : s / (A)divisor);
    }
}

#define COL_SUM(T, S)                                                                                \
    extern "C" __global__ void col_sum_##S(const T* x, T* out, i64 rows, i64 cols, double div) {    \
        col_sum_impl<T, T>(x, out, rows, cols, div);                                                 \
    }                                                                                                \
    extern "C" __global__ void col_sum_##S##_i64(const T* x, i64* out, i64 rows, i64 cols,          \
                                                 double div) {                                       \
        col_sum_impl<T, i64>(x, out, rows, cols, div);                                               \
    }                                                                                                \
    extern "C" __global__ void col_sum_##S##_acc(const T* x, acc_t<T>::type* out, i64 rows,         \
                                                 i64 cols, double div) {                             \
        col_sum_impl<T, acc_t<T>::type>(x, out, rows, cols, div);                                    \
    }                                                                                                \
    extern "C" __global__ void col_sum_acc_##S(const acc_t<T>::type* x, T* out, i64 rows, i64 cols, \
                                               double div) {                                         \
        col_sum_impl<acc_t<T>::type, T>(x, out, rows, cols, div);                                    \
    }                                                                                                \
    extern "C" __global__ void col_sum_acc_##S##_i64(const acc_t<T>::type* x, i64* out, i64 rows,   \
                                                     i64 cols, double div) {                         \
        col_sum_impl<acc_t<T>::type, i64>(x, out, rows, cols, div);                                  \
    }
EMBER_ALL_TYPES(COL_SUM)

// Softmax (or log-softmax) over contiguous rows of length `cols`; one block per row.
// With `cached` (the launch's dynamic shared memory holds a row of accumulator
// values), the row is read from global memory once: the first pass keeps it in
// shared memory while it finds the maximum, the exponentials' sum and the output
// read it there. Longer rows are read three times.
extern __shared__ __align__(16) unsigned char softmax_row[];

// The larger of a and b; a NaN in either wins (PyTorch's softmax of a row with a
// NaN is NaN throughout).
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) {
    return (b > a || b != b) ? b : a;
}

// Maximum over the block (NaN wins); the result is valid in thread 0.
template <typename A> __device__ __forceinline__ A block_max(A v, A* shared) {
    for (int d = 16; d > 0; d >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, d));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) / 32;
    v = shared[threadIdx.x < nwarps ? threadIdx.x : 0];
    if (warp == 0)
        for (int d = 16; d > 0; d >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, d));
    return v;
}

template <typename T>
__device__ void softmax_impl(const T* x, T* out, i64 rows, i64 cols, int is_log, int cached) {
    typedef decltype(widen(x[0])) A;
    __shared__ A sv[32];
    __shared__ A row_max, row_sum;
    A* row = reinterpret_cast<A*>(softmax_row);
    const i64 step = blockDim.x;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        T* yr = out + r * cols;
        // any element of the row starts the maximum; four loads in flight per thread
        A m0 = widen(xr[0]), m1 = m0, m2 = m0, m3 = m0;
        i64 j = threadIdx.x;
        for (; j + 3 * step < cols; j += 4 * step) {
            A v0 = widen(xr[j]), v1 = widen(xr[j + step]), v2 = widen(xr[j + 2 * step]),
              v3 = widen(xr[j + 3 * step]);
            if (cached) {
                row[j] = v0;
                row[j + step] = v1;
                row[j + 2 * step] = v2;
                row[j + 3 * step] = v3;
            }
            m0 = nan_max(m0, v0);
            m1 = nan_max(m1, v1);
            m2 = nan_max(m2, v2);
            m3 = nan_max(m3, v3);
        }
        for (; j < cols; j += step) {
            A v = widen(xr[j]);
            if (cached) row[j] = v;
            m0 = nan_max(m0, v);
        }
        A m = block_max(nan_max(nan_max(m0, m1), nan_max(m2, m3)), sv);
        if (threadIdx.x == 0) row_max = m;
        __syncthreads();
        m = row_max;
        A s0 = (A)0, s1 = (A)0;
        j = threadIdx.x;
        for (; j + step < cols; j += 2 * step) {
            A v0 = cached ? row[j] : widen(xr[j]);
            A v1 = cached ? row[j + step] : widen(xr[j + step]);
            s0 += exp(v0 - m);
            s1 += exp(v1 - m);
        }
        for (; j < cols; j += step) s0 += exp((cached ? row[j] : widen(xr[j])) - m);
        A s = block_sum(s0 + s1, sv);
        if (threadIdx.x == 0) row_sum = s;
        __syncthreads();
        s = row_sum;
        if (is_log) {
            A lse = log(s);
            for (j = threadIdx.x; j < cols; j += step)
                yr[j] = narrow<T>((cached ? row[j] : widen(xr[j])) - m - lse);
        } else {
            A inv = (A)1 / s;
            for (j = threadIdx.x; j < cols; j += step)
                yr[j] = narrow<T>(exp((cached ? row[j] : widen(xr[j])) - m) * inv);
        }
        __syncthreads();
    }
}

#define SOFTMAX(T, S)                                                                                \
    extern "C" __global__ void softmax_##S(const T* x, T* out, i64 rows, i64 cols, int is_log,      \
                                           int cached) {                                             \
        softmax_impl(x, out, rows, cols, is_log, cached);                                            \
    }
EMBER_FLOAT_TYPES(SOFTMAX)

// The input gradient of softmax over contiguous rows from the output's gradient g and
// the output y: y * (g - sum(g * y)), or for log-softmax g - exp(y) * sum(g); one
// block per row.
template <typename T>
__device__ void softmax_backward_impl(const T* g, const T* y, T* out, i64 rows, i64 cols, int is_log) {
    typedef decltype(widen(g[0])) A;
    __shared__ A sv[32];
    __shared__ A row_sum;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* gr = g + r * cols;
        const T* yr = y + r * cols;
        T* dr = out + r * cols;
        A s = (A)0;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x)
            s += is_log ? widen(gr[j]) : widen(gr[j]) * widen(yr[j]);
        s = block_sum(s, sv);
        if (threadIdx.x == 0) row_sum = s;
        __syncthreads();
        s = row_sum;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            const A gj = widen(gr[j]), yj = widen(yr[j]);
            dr[j] = narrow<T>(is_log ? gj - exp(yj) * s : yj * (gj - s));
        }
        __syncthreads();
    }
}

#define SOFTMAX_BACKWARD(T, S)                                                                       \
    extern "C" __global__ void softmax_backward_##S(const T* g, const T* y, T* out, i64 rows,       \
                                                    i64 cols, int is_log) {                         \
        softmax_backward_impl(g, y, out, rows, cols, is_log);                                        \
    }
EMBER_FLOAT_TYPES(SOFTMAX_BACKWARD)

// Cross-entropy of contiguous rows of logits against one class index per row, one
// block per row, in the accumulator type A. Each thread keeps a running maximum and
// the sum of exp(x - max) rescaled whenever its maximum grows, so the row is read
// once for lse = max + log(sum) and the row's sum (for label smoothing); then
// loss = (1 - ls) (lse - x[t]) + ls (lse - mean(x)), and 0 where t is `ignore`
// (a target out of range, which the caller reports, gives NaN). `lse` gets the
// row's max and log(sum) side by side. With `half_steps` (no smoothing) the loss
// is -round_T(x[t] - lse): the log-probability rounded to T, as a separate
// log-softmax in T would leave it for the loss to pick.
template <typename A> __device__ __forceinline__ void lse_add(A& m, A& s, A v) {
    // NaN, or +inf (whose exp(x - max) is exp(inf - inf)), makes the row NaN, as
    // PyTorch's log_softmax does
    if (v != v || m != m || v == (A)__int_as_float(0x7f800000)) {
        m = (A)__int_as_float(0x7fffffff);
        s = m;
    } else if (v > m) {
        s = s * exp(m - v) + (A)1;
        m = v;
    } else if (v > (A)__int_as_float(0xff800000)) {  // v > -inf
        s += exp(v - m);
    }
}

// (m, s) combined with (m2, s2): the larger maximum, each sum rescaled to it.
template <typename A> __device__ __forceinline__ void lse_merge(A& m, A& s, A m2, A s2) {
    if (m2 != m2 || m != m) {
        m = m2 != m2 ? m2 : m;
        s = m;
        return;
    }
    A top = m2 > m ? m2 : m;
    A t = (A)0;
    if (s > (A)0) t += s * exp(m - top);
    if (s2 > (A)0) t += s2 * exp(m2 - top);
    m = top;
    s = t;
}

template <typename T>
__device__ void cross_entropy_impl(const T* x, const i64* target, typename acc_t<T>::type* loss,
                                   typename acc_t<T>::type* lse, i64 rows, i64 cols, i64 ignore,
                                   double smoothing, int half_steps) {
    typedef typename acc_t<T>::type A;
    __shared__ A sm[32], ss[32], sx[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        A m = (A)__int_as_float(0xff800000), s = (A)0, sum = (A)0;  // m = -inf
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            A v = widen(xr[j]);
            lse_add(m, s, v);
            sum += v;
        }
        for (int d = 16; d > 0; d >>= 1) {
            A m2 = __shfl_xor_sync(0xffffffffu, m, d), s2 = __shfl_xor_sync(0xffffffffu, s, d);
            lse_merge(m, s, m2, s2);
            sum += __shfl_xor_sync(0xffffffffu, sum, d);
        }
        int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        __syncthreads();
        if (lane == 0) {
            sm[warp] = m;
            ss[warp] = s;
            sx[warp] = sum;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int nwarps = (blockDim.x + 31) / 32;
            for (int w = 1; w < nwarps; w++) {
                lse_merge(m, s, sm[w], ss[w]);
                sum += sx[w];
            }
            // lse = m + l, kept apart: x - lse is taken as (x - m) - l, exact where
            // the logits are large and close (PyTorch's log_softmax order)
            A l = log(s);
            i64 t = target[r];
            A out = (A)0;
            if (t != ignore) {
                if (t < 0 || t >= cols) {
                    out = (A)__int_as_float(0x7fffffff);  // NaN
                } else if (half_steps) {
                    out = -(A)widen(narrow<T>((widen(xr[t]) - m) - l));
                } else {
                    // the spread term only with smoothing: a -inf logit makes it
                    // infinite, and 0 * inf would be NaN
                    A ls = (A)smoothing;
                    out = ((A)1 - ls) * ((m - widen(xr[t])) + l);
                    if (smoothing != 0.0) out += ls * ((m - sum / (A)cols) + l);
                }
            }
            loss[r] = out;
            lse[2 * r] = m;
            lse[2 * r + 1] = l;
        }
    }
}

// The logits' gradient of cross_entropy_impl's rows from each row's loss gradient g
// and (max, log-sum): g (exp(x - lse) - (1 - ls) [j = t] - ls / cols), 0 in rows
// whose target is `ignore`. With `half_steps`, g exp(round_T(x - lse)) - g [j = t]:
// a log-softmax's backward from the log-probabilities in T it kept.
template <typename T>
__device__ void cross_entropy_back_impl(const T* x, const i64* target,
                                        const typename acc_t<T>::type* lse,
                                        const typename acc_t<T>::type* g, T* gx, i64 rows, i64 cols,
                                        i64 ignore, double smoothing, int half_steps) {
    typedef typename acc_t<T>::type A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        T* gr = gx + r * cols;
        const i64 t = target[r];
        const bool keep = t != ignore;
        const A gi = keep ? g[r] : (A)0, m = lse[2 * r], l = lse[2 * r + 1];
        const A ls = (A)smoothing, hit = (A)1 - ls, off = ls / (A)cols;
        if (half_steps) {
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
                const A p = exp((A)widen(narrow<T>((widen(xr[j]) - m) - l)));
                gr[j] = narrow<T>(keep ? gi * p - (j == t ? gi : (A)0) : (A)0);
            }
        } else {
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
                A d = exp((widen(xr[j]) - m) - l) - off - (j == t ? hit : (A)0);
                gr[j] = narrow<T>(keep ? gi * d : (A)0);
            }
        }
    }
}

#define CROSS_ENTROPY(T, S)                                                                          \
    extern "C" __global__ void cross_entropy_##S(const T* x, const i64* target,                     \
                                                 acc_t<T>::type* loss, acc_t<T>::type* lse,         \
                                                 i64 rows, i64 cols, i64 ignore, double smoothing,  \
                                                 int half_steps) {                                  \
        cross_entropy_impl(x, target, loss, lse, rows, cols, ignore, smoothing, half_steps);         \
    }                                                                                                \
    extern "C" __global__ void cross_entropy_back_##S(                                               \
        const T* x, const i64* target, const acc_t<T>::type* lse, const acc_t<T>::type* g, T* gx,  \
        i64 rows, i64 cols, i64 ignore, double smoothing, int half_steps) {                          \
        cross_entropy_back_impl(x, target, lse, g, gx, rows, cols, ignore, smoothing, half_steps);   \
    }
EMBER_FLOAT_TYPES(CROSS_ENTROPY)

// A row's elements a thread keeps in registers in the normalisation kernels:
// rows of up to blockDim.x * NORM_CACHE elements are read from memory once.
#define NORM_CACHE 8

// The column of element c of this thread's share of a row.
__device__ __forceinline__ i64 norm_col(int c) { return threadIdx.x + (i64)c * blockDim.x; }

// Element c of this thread's share of a row, or `none` past the row's end.
template <typename T, typename A> __device__ __forceinline__ A norm_load(const T* row, i64 cols, int c, A none) {
    const i64 j = norm_col(c);
    return j < cols ? (A)widen(row[j]) : none;
}

// (xhat) * w[j] + b[j], each part where given (null: absent); xhat itself
// without AFFINE.
template <bool AFFINE, typename T, typename A>
__device__ __forceinline__ A norm_affine(A xhat, const T* w, const T* b, i64 j) {
    if (!AFFINE) return xhat;
    A y = w ? xhat * (A)widen(w[j]) : xhat;
    return b ? y + (A)widen(b[j]) : y;
}

// g * w[j] (w null: g), 0 past the row's end.
template <typename T, typename A>
__device__ __forceinline__ A norm_weighted(A g, const T* w, i64 j, i64 cols) {
    return (w && j < cols) ? g * (A)widen(w[j]) : g;
}

// Layer (or RMS) normalisation of contiguous rows of length `cols`, one block per
// row: the mean, then the mean square of the deviations (two passes, in the
// accumulator type), rstd = 1 / sqrt(var + eps); writes (x - mean) * rstd, times
// w and plus b where given (null: absent; only the AFFINE instance reads them,
// so the plain one keeps its registers), and each row's mean and rstd to
// stats[2r], stats[2r + 1]. A row that fits the threads' register caches is read
// once; a longer one is read for each pass. Either way each thread sums its
// elements in the same order, so the results are the same bits.
template <typename T, bool AFFINE>
__device__ void norm_rows_impl(const T* x, const T* w, const T* b, T* out,
                               typename acc_t<T>::type* stats, i64 rows, i64 cols, double eps,
                               int rms) {
    typedef decltype(widen(x[0])) A;
    __shared__ A sv[32];
    __shared__ A row_mean, row_rstd;
    const bool cached = cols <= (i64)blockDim.x * NORM_CACHE;
    A xc[NORM_CACHE];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        T* yr = out + r * cols;
        if (cached) {
#pragma unroll
            for (int c = 0; c < NORM_CACHE; ++c) xc[c] = norm_load(xr, cols, c, (A)0);
        }
        A m = (A)0;
        if (!rms) {
            if (cached) {
#pragma unroll
                for (int c = 0; c < NORM_CACHE; ++c)
                    if (norm_col(c) < cols) m += xc[c];
            } else {
                for (i64 j = threadIdx.x; j < cols; j += blockDim.x) m += widen(xr[j]);
            }
            m = block_sum(m, sv);
            if (threadIdx.x == 0) row_mean = m / (A)cols;
            __syncthreads();
            m = row_mean;
        }
        A ss = (A)0;
        if (cached) {
#pragma unroll
            for (int c = 0; c < NORM_CACHE; ++c) {
                if (norm_col(c) < cols) {
                    const A d = xc[c] - m;
                    ss += d * d;
                }
            }
        } else {
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
                const A d = widen(xr[j]) - m;
                ss += d * d;
            }
        }
        ss = block_sum(ss, sv);
        if (threadIdx.x == 0) {
            row_rstd = (A)1 / sqrt(ss / (A)cols + (A)eps);
            stats[2 * r] = m;
            stats[2 * r + 1] = row_rstd;
        }
        __syncthreads();
        const A s = row_rstd;
        if (cached) {
#pragma unroll
            for (int c = 0; c < NORM_CACHE; ++c) {
                const i64 j = norm_col(c);
                if (j < cols) yr[j] = narrow<T>(norm_affine<AFFINE>((xc[c] - m) * s, w, b, j));
            }
        } else {
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x)
                yr[j] = narrow<T>(norm_affine<AFFINE>((widen(xr[j]) - m) * s, w, b, j));
        }
        __syncthreads();
    }
}

// The input gradient of norm_rows from the output's gradient g, its input x and
// statistics and its weight w (null: 1): with gw = g * w and xhat = (x - mean) *
// rstd, rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) per row (no mean(gw) term
// for RMS normalisation); one block per row. Rows that fit the register caches
// read g and x once, longer ones twice; the same bits.
template <typename T>
__device__ void norm_rows_backward_impl(const T* g, const T* x, const typename acc_t<T>::type* stats,
                                        const T* w, T* out, i64 rows, i64 cols, int rms) {
    typedef decltype(widen(g[0])) A;
    __shared__ A sv[32];
    __shared__ A mean_g, mean_gx;
    const bool cached = cols <= (i64)blockDim.x * NORM_CACHE;
    A gc[NORM_CACHE], xc[NORM_CACHE];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* gr = g + r * cols;
        const T* xr = x + r * cols;
        T* dr = out + r * cols;
        const A m = stats[2 * r], s = stats[2 * r + 1];
        A sg = (A)0, sgx = (A)0;
        if (cached) {
#pragma unroll
            for (int c = 0; c < NORM_CACHE; ++c) {
                const i64 j = norm_col(c);
                gc[c] = norm_weighted(norm_load(gr, cols, c, (A)0), w, j, cols);
                xc[c] = (norm_load(xr, cols, c, m) - m) * s;
                if (j < cols) {
                    sg += gc[c];
                    sgx += gc[c] * xc[c];
                }
            }
        } else {
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
                const A gj = norm_weighted((A)widen(gr[j]), w, j, cols);
                sg += gj;
                sgx += gj * ((widen(xr[j]) - m) * s);
            }
        }
        sg = block_sum(sg, sv);
        if (threadIdx.x == 0) mean_g = rms ? (A)0 : sg / (A)cols;
        __syncthreads();
        sgx = block_sum(sgx, sv);
        if (threadIdx.x == 0) mean_gx = sgx / (A)cols;
        __syncthreads();
        const A mg = mean_g, mgx = mean_gx;
        if (cached) {
#pragma unroll
            for (int c = 0; c < NORM_CACHE; ++c) {
                const i64 j = norm_col(c);
                if (j < cols) dr[j] = narrow<T>(s * (gc[c] - mg - xc[c] * mgx));
            }
        } else {
            for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
                const A gj = norm_weighted((A)widen(gr[j]), w, j, cols);
                dr[j] = narrow<T>(s * (gj - mg - ((widen(xr[j]) - m) * s) * mgx));
            }
        }
        __syncthreads();
    }
}

// The weight and bias gradients of norm_rows, first pass: block (x, y) sums the
// columns x * COL_W .. + COL_W of g * xhat and of g over the rows of chunk y
// (`per_chunk` rows, norm_affine_chunks in Rust; the mean is 0 for RMS
// normalisation), COL_H row slices per block
// summed in order, into partial[(2 * y) * cols + c] and partial[(2 * y + 1) * cols
// + c]. No atomics: every partial has one writer.
template <typename T>
__device__ void norm_affine_partial_impl(const T* g, const T* x, const typename acc_t<T>::type* stats,
                                         typename acc_t<T>::type* partial, i64 rows, i64 cols,
                                         i64 per_chunk) {
    typedef typename acc_t<T>::type A;
    __shared__ A pw[COL_H][COL_W + 1], pb[COL_H][COL_W + 1];
    const i64 c = (i64)blockIdx.x * COL_W + threadIdx.x;
    const i64 r0 = (i64)blockIdx.y * per_chunk;
    const i64 r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
    A sw = (A)0, sb = (A)0;
    if (c < cols) {
        for (i64 r = r0 + threadIdx.y; r < r1; r += COL_H) {
            const A gv = widen(g[r * cols + c]);
            sw += gv * ((widen(x[r * cols + c]) - stats[2 * r]) * stats[2 * r + 1]);
            sb += gv;
        }
    }
    pw[threadIdx.y][threadIdx.x] = sw;
    pb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        for (int k = 1; k < COL_H; ++k) {
            sw += pw[k][threadIdx.x];
            sb += pb[k][threadIdx.x];
        }
        partial[(2 * (i64)blockIdx.y) * cols + c] = sw;
        partial[(2 * (i64)blockIdx.y + 1) * cols + c] = sb;
    }
}

// Second pass: the sums over chunks, in order, of partial[(2 * chunk + k) * cols
// + c]: k = 0 into dw[c] (the weight's), k = 1 into db[c] (the bias's).
template <typename T>
__device__ void norm_affine_sum_impl(const typename acc_t<T>::type* partial, T* dw, T* db,
                                     i64 chunks, i64 cols) {
    typedef typename acc_t<T>::type A;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < 2 * cols; i += (i64)gridDim.x * blockDim.x) {
        const i64 k = i / cols, c = i % cols;
        A s = (A)0;
        for (i64 y = 0; y < chunks; ++y) s += partial[(2 * y + k) * cols + c];
        (k == 0 ? dw : db)[c] = narrow<T>(s);
    }
}

#define NORM_ROWS(T, S)                                                                              \
    extern "C" __global__ void norm_rows_##S(const T* x, const T* w, const T* b, T* out,            \
                                             acc_t<T>::type* stats, i64 rows, i64 cols,              \
                                             double eps, int rms) {                                 \
        norm_rows_impl<T, false>(x, w, b, out, stats, rows, cols, eps, rms);                         \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(256, 4) norm_rows_affine_##S(const T* x, const T* w, const T* b, T* out,     \
                                                    acc_t<T>::type* stats, i64 rows, i64 cols,       \
                                                    double eps, int rms) {                          \
        norm_rows_impl<T, true>(x, w, b, out, stats, rows, cols, eps, rms);                          \
    }                                                                                                \
    extern "C" __global__ void norm_rows_backward_##S(const T* g, const T* x,                       \
                                                      const acc_t<T>::type* stats, const T* w,      \
                                                      T* out, i64 rows, i64 cols, int rms) {        \
        norm_rows_backward_impl(g, x, stats, w, out, rows, cols, rms);                               \
    }                                                                                                \
    extern "C" __global__ void norm_affine_partial_##S(const T* g, const T* x,                      \
                                                       const acc_t<T>::type* stats,                 \
                                                       acc_t<T>::type* partial, i64 rows, i64 cols, \
                                                       i64 per_chunk) {                             \
        norm_affine_partial_impl(g, x, stats, partial, rows, cols, per_chunk);                       \
    }                                                                                                \
    extern "C" __global__ void norm_affine_sum_##S(const acc_t<T>::type* partial, T* dw, T* db,     \
                                                   i64 chunks, i64 cols) {                           \
        norm_affine_sum_impl(partial, dw, db, chunks, cols);                                         \
    }
EMBER_FLOAT_TYPES(NORM_ROWS)

// Batch normalisation's per-channel work on a contiguous array seen as [n, c, s]
// (dim 1 the channels, s the product of the dims after it). Statistics and
// coefficients are float for f16/bf16/f32 and double for f64.
template <typename T> struct stat_t { typedef float type; };
template <> struct stat_t<double> { typedef double type; };

// The (b, i) of a block's threads over a channel's n planes of s elements, from
// element `start` of the channel: thread t starts at element start + t and steps
// by blockDim.x, with one division at the start and none per element.
struct plane_walk {
    i64 b, i, db, di;
    __device__ plane_walk(i64 s, i64 start) {
        // (empty planes: nothing is walked, but nothing divides by 0 either)
        const i64 q = s > 0 ? s : 1, e = start + threadIdx.x;
        b = e / q;
        i = e - b * q;
        db = blockDim.x / q;
        di = blockDim.x - db * q;
    }
    __device__ __forceinline__ void next(i64 s) {
        b += db;
        i += di;
        if (i >= s) {
            i -= s;
            b += 1;
        }
    }
};

// Adds an element's terms of batch norm's per-channel sums to s1 and s2: v and
// v * v (dot == 0), or g and g * v (dot == 1), where v = x - k (k the shift: a
// first value of the channel, or its mean). With `masked` (y: the output of a
// batch norm with its ReLU) g counts where y is above 0, as the ReLU's gradient
// does. channel_terms reads element j's values.
template <typename T>
__device__ __forceinline__ void channel_term(T gj_, T yj, T xj, bool masked, double k, int dot, double& s1,
                                             double& s2) {
    const double v = (double)widen(xj) - k;
    if (dot) {
        const double gj = masked && !(widen(yj) > 0.f) ? 0.0 : (double)widen(gj_);
        s1 += gj;
        s2 += gj * v;
    } else {
        s1 += v;
        s2 += v * v;
    }
}
template <typename T>
__device__ __forceinline__ void channel_terms(const T* g, const T* y, const T* x, i64 j, double k, int dot,
                                              double& s1, double& s2) {
    const T xj = x[j];
    channel_term(dot ? g[j] : xj, y ? y[j] : xj, xj, y != nullptr, k, dot, s1, s2);
}

// Batch norm's per-channel sums over [n, c, s] elements with planes of s > 1 (or
// none: s == 0 or n == 0), blockIdx.x a channel (grid-stride over them): without
// g (dot == 0) the sums of v = x - x[first element of the channel] and v * v
// (the shift keeps the variance's digits where the mean is large), with g
// (dot == 1) of g and g * (x - mean). A channel's n * s elements are cut into chunks of `per`
// (blockIdx.y the chunk), so that few channels of many elements still take every
// multiprocessor. With one chunk the block writes the result, out[ch] and
// out[c + ch] (the mean and biased variance, or the two sums); with more it
// writes its chunk's two sums to part[2 * chunk * c + ch] and
// part[(2 * chunk + 1) * c + ch], in double, which channel_sums_finish adds in
// chunk order (the result does not depend on timing).
template <typename T>
__device__ void channel_sums_impl(const T* g, const T* y, const T* x, const typename stat_t<T>::type* mean,
                                  typename stat_t<T>::type* out, double* part, i64 n, i64 c, i64 s,
                                  i64 per, int dot) {
    typedef typename stat_t<T>::type S;
    __shared__ double sv[32];
    __shared__ double t1;
    const i64 total = n * s;
    const i64 e0 = (i64)blockIdx.y * per;
    const i64 e1 = e0 + per < total ? e0 + per : total;
    for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const double k = dot ? (double)mean[ch] : total > 0 ? (double)widen(x[ch * s]) : 0.0;
        double s1 = 0, s2 = 0;
        plane_walk w(s, e0);
        for (i64 e = e0 + threadIdx.x; e < e1; e += blockDim.x, w.next(s)) {
            channel_terms(g, y, x, (w.b * c + ch) * s + w.i, k, dot, s1, s2);
        }
        s1 = block_sum(s1, sv);
        if (threadIdx.x == 0) t1 = s1;
        __syncthreads();
        s1 = t1;
        s2 = block_sum(s2, sv);
        if (threadIdx.x == 0) {
            if (gridDim.y > 1) {
                part[2 * (i64)blockIdx.y * c + ch] = s1;
                part[(2 * (i64)blockIdx.y + 1) * c + ch] = s2;
            } else if (dot) {
                out[ch] = (S)s1;
                out[c + ch] = (S)s2;
            } else {
                const double count = (double)total;
                out[ch] = (S)(k + s1 / count);
                out[c + ch] = (S)((s2 - s1 * s1 / count) / count);
            }
        }
        __syncthreads();
    }
}

// Channels-last batch norm's per-channel sums: the elements seen as [m, c] rows
// (a channel a column, [n, h, w, c] as [n * h * w, c]), where one block per
// channel would read every c-th element. Blocks of 32 x 8 threads: x picks a
// channel of a 32-channel tile (a warp reads 32 adjacent channels of a row), y
// one of 8 row lanes; blockIdx.x is the tile, blockIdx.y the chunk of `rows`
// rows. Each block writes its chunk's two sums per channel into part[2 * chunk]
// and part[2 * chunk + 1] (rows of c, in double); channel_sums_finish adds the
// chunks in order, so the result does not depend on timing. Statistics (dot == 0)
// sum v = x - x[first row] and v * v (the shift keeps the variance exact where
// the mean is large), as channel_stats does; dot == 1 sums g and g * (x - mean).
template <typename T>
__device__ void channel_cols_impl(const T* g, const T* y, const T* x, const typename stat_t<T>::type* mean,
                                  double* part, i64 m, i64 c, i64 rows, int dot) {
    __shared__ double s1s[8][33], s2s[8][33];
    const i64 ch = (i64)blockIdx.x * 32 + threadIdx.x;
    const i64 r0 = (i64)blockIdx.y * rows;
    const i64 r1 = r0 + rows < m ? r0 + rows : m;
    double s1 = 0, s2 = 0;
    if (ch < c) {
        const double k = dot ? (double)mean[ch] : (double)widen(x[ch]);
        i64 r = r0 + threadIdx.y;
        // four rows' loads in flight at a time (a thread's loads one at a time left
        // the kernel waiting on memory), the sums still in row order
        for (; r + 24 < r1; r += 32) {
            T xs[4], gs[4], ys[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const i64 j = (r + 8 * u) * c + ch;
                xs[u] = x[j];
                gs[u] = dot ? g[j] : xs[u];
                ys[u] = y ? y[j] : xs[u];
            }
#pragma unroll
            for (int u = 0; u < 4; u++) channel_term(gs[u], ys[u], xs[u], y != nullptr, k, dot, s1, s2);
        }
        for (; r < r1; r += 8) channel_terms(g, y, x, r * c + ch, k, dot, s1, s2);
    }
    s1s[threadIdx.y][threadIdx.x] = s1;
    s2s[threadIdx.y][threadIdx.x] = s2;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        double a = 0, b = 0;
        for (int y = 0; y < 8; y++) {
            a += s1s[y][threadIdx.x];
            b += s2s[y][threadIdx.x];
        }
        part[2 * (i64)blockIdx.y * c + ch] = a;
        part[(2 * (i64)blockIdx.y + 1) * c + ch] = b;
    }
}

// channel_cols_impl with 16-byte loads: each thread takes V = 16 / sizeof(T)
// adjacent channels (c a multiple of V, the arrays aligned to 16 bytes), so L =
// 32 / V threads read a row's 32-channel tile and a block of 256 threads
// (blockDim.x) R = 256 / L rows at a time, U of them in flight (four; two of
// 8 channels, whose 16 float64 sums and loads keep a thread's registers at
// most 128, two blocks a multiprocessor). The grid,
// the chunks of `rows` rows and the partial sums in `part` are channel_cols'.
// A warp's rows are added by shuffles, then the block's 8 warps in shared
// memory, in a fixed order (the result does not depend on timing).
template <typename T, int V>
__device__ void channel_cols_vec_impl(const T* g, const T* y, const T* x, const typename stat_t<T>::type* mean,
                                      double* part, i64 m, i64 c, i64 rows, int dot) {
    constexpr int L = 32 / V, R = 256 / L, U = V >= 8 ? 2 : 4;
    __shared__ double s1s[8][32], s2s[8][32];
    const int t = threadIdx.x, lane = t % L;
    const i64 ch0 = (i64)blockIdx.x * 32 + lane * V;
    const i64 r0 = (i64)blockIdx.y * rows;
    const i64 r1 = r0 + rows < m ? r0 + rows : m;
    typedef VecN<T, V> Vec;
    double s1[V], s2[V];
#pragma unroll
    for (int e = 0; e < V; e++) s1[e] = s2[e] = 0;
    if (ch0 < c) {
        double k[V];
        const Vec x0 = *(const Vec*)(x + ch0);
#pragma unroll
        for (int e = 0; e < V; e++) k[e] = dot ? (double)mean[ch0 + e] : (double)widen(x0.v[e]);
        i64 r = r0 + t / L;
        for (; r + (U - 1) * R < r1; r += U * R) {
            Vec xs[U], gs[U], ys[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const i64 j = (r + R * u) * c + ch0;
                xs[u] = *(const Vec*)(x + j);
                gs[u] = dot ? *(const Vec*)(g + j) : xs[u];
                ys[u] = y ? *(const Vec*)(y + j) : xs[u];
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int e = 0; e < V; e++)
                    channel_term(gs[u].v[e], ys[u].v[e], xs[u].v[e], y != nullptr, k[e], dot, s1[e], s2[e]);
        }
        for (; r < r1; r += R) {
            const i64 j = r * c + ch0;
            const Vec xv = *(const Vec*)(x + j);
            const Vec gv = dot ? *(const Vec*)(g + j) : xv;
            const Vec yv = y ? *(const Vec*)(y + j) : xv;
#pragma unroll
            for (int e = 0; e < V; e++)
                channel_term(gv.v[e], yv.v[e], xv.v[e], y != nullptr, k[e], dot, s1[e], s2[e]);
        }
    }
    // lanes L apart hold the same channels (of other rows)
    for (int o = L; o < 32; o <<= 1) {
#pragma unroll
        for (int e = 0; e < V; e++) {
            s1[e] += __shfl_xor_sync(0xffffffffu, s1[e], o);
            s2[e] += __shfl_xor_sync(0xffffffffu, s2[e], o);
        }
    }
    if (t % 32 < L) {
#pragma unroll
        for (int e = 0; e < V; e++) {
            s1s[t / 32][lane * V + e] = s1[e];
            s2s[t / 32][lane * V + e] = s2[e];
        }
    }
    __syncthreads();
    const i64 ch = (i64)blockIdx.x * 32 + t;
    if (t < 32 && ch < c) {
        double a = 0, b = 0;
        for (int w = 0; w < 8; w++) {
            a += s1s[w][t];
            b += s2s[w][t];
        }
        part[2 * (i64)blockIdx.y * c + ch] = a;
        part[(2 * (i64)blockIdx.y + 1) * c + ch] = b;
    }
}

// out[ch] and out[c + ch] from the partial sums of `chunks` chunks over m
// elements a channel (channel_cols' rows, or channel_sums' chunks of planes of s
// elements): the mean and biased variance (dot == 0; x[ch * s] gives the shift
// back), or the two sums (dot == 1).
template <typename T>
__device__ void channel_sums_finish_impl(const double* part, const T* x, typename stat_t<T>::type* out,
                                         i64 chunks, i64 m, i64 c, i64 s, int dot) {
    typedef typename stat_t<T>::type S;
    FOR_EACH(ch, c) {
        double s1 = 0, s2 = 0;
        for (i64 b = 0; b < chunks; b++) {
            s1 += part[2 * b * c + ch];
            s2 += part[(2 * b + 1) * c + ch];
        }
        if (dot) {
            out[ch] = (S)s1;
            out[c + ch] = (S)s2;
        } else {
            const double count = (double)m;
            out[ch] = (S)((double)widen(x[ch * s]) + s1 / count);
            out[c + ch] = (S)((s2 - s1 * s1 / count) / count);
        }
    }
}

// out = p * a[ch] + d[ch], or with q (k == 3) p * a[ch] + d[ch] + q * b[ch], or
// with q and k == 2 p * a[ch] + d[ch] + q (a residual); coef holds k rows of c
// (a, d or a, b, d). With `relu` the result goes through a
// ReLU (a batch norm and its ReLU forward); a non-null y (that pair's output)
// masks p as the ReLU's gradient does (0 where y is not above 0: their
// backward). The elements are [n, c, s] (s == 1 for
// channels-last arrays, seen as [n * h * w, c, 1]) and are taken V at a time (one
// load or store of V * sizeof(T) bytes, the arrays aligned to that): where s > 1
// V divides s, so a vector lies in one plane, of channel (v / vs) % vc with
// vs = s / V and vc = c; where s == 1 (`lanes`) V divides c, and vector v holds
// the V channels from V * ((v / vs) % vc), with vs = 1 and vc = c / V. Where
// `small` (fewer than 2^31 vectors), both divisions are multiplications by
// magic numbers (m1, sh1 for vs; m2, sh2 for vc) as in loc_at. Channels-last
// arrays take channel_affine_lanes_impl where the grid allows.
template <typename T, int V>
__device__ void channel_affine_impl(const T* p, const T* q, const T* y, const typename stat_t<T>::type* coef,
                                    T* out, i64 nv, i64 c, i64 vs, i64 vc, unsigned m1, unsigned m2, int sh1,
                                    int sh2, int small, int lanes, int k, int relu) {
    typedef typename stat_t<T>::type S;
    const VecN<T, V>* pv = (const VecN<T, V>*)p;
    const VecN<T, V>* qv = (const VecN<T, V>*)q;
    const VecN<T, V>* yv = (const VecN<T, V>*)y;
    VecN<T, V>* ov = (VecN<T, V>*)out;
    FOR_EACH(v, nv) {
        i64 r;
        if (small) {
            const unsigned u = (unsigned)v;
            const unsigned pl = (ember_umulhi(u, m1) + u) >> sh1;
            const unsigned qq = (ember_umulhi(pl, m2) + pl) >> sh2;
            r = (i64)(pl - qq * (unsigned)vc);
        } else {
            r = (v / vs) % vc;
        }
        const VecN<T, V> a = pv[v];
        VecN<T, V> b, m;
        if (q) b = qv[v];
        if (y) m = yv[v];
        VecN<T, V> o;
#pragma unroll
        for (int l = 0; l < V; ++l) {
            const i64 ch = lanes ? r * V + l : r;
            // p masked where the ReLU's output is not above 0 (its gradient)
            const S pl = y && !(widen(m.v[l]) > 0.f) ? (S)0 : (S)widen(a.v[l]);
            S val = pl * coef[ch] + coef[(k - 1) * c + ch];
            if (k == 3) {
                val += (S)widen(b.v[l]) * coef[c + ch];
            } else if (q) {
                val += (S)widen(b.v[l]);  // a residual, added before the ReLU
            }
            // the ReLU after the map: 0 for what is not above 0, NaN kept
            if (relu && val <= (S)0) val = (S)0;
            o.v[l] = narrow<T>(val);
        }
        ov[v] = o;
    }
}

// channel_affine over channels-last elements (s == 1, vc = c / V vectors a row)
// with a grid whose threads are a multiple of vc: a thread's grid-stride
// vectors then all hold the same V channels, whose coefficients it reads once.
// (In channel_affine_impl a vector's coefficients are V loads from each row,
// which touch 8 to 24 cache lines a warp for one 16-byte load of data; on the
// H200 its bf16 channels-last map took as long as float32's, which those loads
// would explain: not measured since.) Q: q is given (k == 3, or a residual);
// the kernel without it (a forward without a residual, a backward through
// running statistics) needs fewer registers.
template <typename T, int V, bool Q>
__device__ void channel_affine_lanes_impl(const T* p, const T* q, const T* y,
                                          const typename stat_t<T>::type* coef, T* out, i64 nv, i64 c, i64 vc,
                                          int k, int relu) {
    typedef typename stat_t<T>::type S;
    const VecN<T, V>* pv = (const VecN<T, V>*)p;
    const VecN<T, V>* qv = (const VecN<T, V>*)q;
    const VecN<T, V>* yv = (const VecN<T, V>*)y;
    VecN<T, V>* ov = (VecN<T, V>*)out;
    const i64 t0 = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 ch0 = (t0 % vc) * V;
    const bool k3 = Q && k == 3;
    S ca[V], cb[V], cd[V];
#pragma unroll
    for (int l = 0; l < V; ++l) {
        ca[l] = coef[ch0 + l];
        cb[l] = k3 ? coef[c + ch0 + l] : (S)0;
        cd[l] = coef[(k - 1) * c + ch0 + l];
    }
    for (i64 v = t0; v < nv; v += (i64)gridDim.x * blockDim.x) {
        const VecN<T, V> a = pv[v];
        // (a's values where there is no q or y: read by nothing)
        VecN<T, V> b = a, m = a;
        if (Q) b = qv[v];
        if (y) m = yv[v];
        VecN<T, V> o;
#pragma unroll
        for (int l = 0; l < V; ++l) {
            // as channel_affine_impl, in the same order
            const S pl = y && !(widen(m.v[l]) > 0.f) ? (S)0 : (S)widen(a.v[l]);
            S val = pl * ca[l] + cd[l];
            if (k3) {
                val += (S)widen(b.v[l]) * cb[l];
            } else if (Q) {
                val += (S)widen(b.v[l]);  // a residual
            }
            if (relu && val <= (S)0) val = (S)0;
            o.v[l] = narrow<T>(val);
        }
        ov[v] = o;
    }
}

// V elements a vector where that fits in 16 bytes of T (the kernels' widest
// access), else 1: the vector widths a dtype's kernel is instantiated for.
#define CHANNEL_VEC(T, V) ((V) * sizeof(T) <= 16 ? (V) : 1)

// channel_affine_lanes_impl for a vector width chosen at run time (the entry
// points below: with and without q, each its own registers).
#define CHANNEL_AFFINE_LANES(T, Q, p, q, y, coef, out, nv, c, vc, k, relu, vec)                     \
    switch (vec) {                                                                                  \
    case 8:                                                                                         \
        channel_affine_lanes_impl<T, CHANNEL_VEC(T, 8), Q>(p, q, y, coef, out, nv, c, vc, k, relu); \
        break;                                                                                      \
    case 4:                                                                                         \
        channel_affine_lanes_impl<T, CHANNEL_VEC(T, 4), Q>(p, q, y, coef, out, nv, c, vc, k, relu); \
        break;                                                                                      \
    case 2:                                                                                         \
        channel_affine_lanes_impl<T, CHANNEL_VEC(T, 2), Q>(p, q, y, coef, out, nv, c, vc, k, relu); \
        break;                                                                                      \
    default:                                                                                        \
        channel_affine_lanes_impl<T, 1, Q>(p, q, y, coef, out, nv, c, vc, k, relu);                 \
    }

#define CHANNEL_OPS(T, S)                                                                            \
    extern "C" __global__ void channel_sums_##S(const T* g, const T* y, const T* x,                 \
                                                const stat_t<T>::type* mean, stat_t<T>::type* out,   \
                                                double* part, i64 n, i64 c, i64 s, i64 per,          \
                                                int dot) {                                           \
        channel_sums_impl(g, y, x, mean, out, part, n, c, s, per, dot);                              \
    }                                                                                                \
    extern "C" __global__ void channel_affine_##S(const T* p, const T* q, const T* y,               \
                                                  const stat_t<T>::type* coef, T* out, i64 nv,      \
                                                  i64 c, i64 vs, i64 vc, unsigned m1, unsigned m2,  \
                                                  int sh1, int sh2, int small, int lanes, int k,    \
                                                  int relu, int vec) {                               \
        switch (vec) {                                                                               \
        case 8:                                                                                      \
            channel_affine_impl<T, CHANNEL_VEC(T, 8)>(p, q, y, coef, out, nv, c, vs, vc, m1, m2,     \
                                                      sh1, sh2, small, lanes, k, relu);              \
            break;                                                                                   \
        case 4:                                                                                      \
            channel_affine_impl<T, CHANNEL_VEC(T, 4)>(p, q, y, coef, out, nv, c, vs, vc, m1, m2,     \
                                                      sh1, sh2, small, lanes, k, relu);              \
            break;                                                                                   \
        case 2:                                                                                      \
            channel_affine_impl<T, CHANNEL_VEC(T, 2)>(p, q, y, coef, out, nv, c, vs, vc, m1, m2,     \
                                                      sh1, sh2, small, lanes, k, relu);              \
            break;                                                                                   \
        default:                                                                                     \
            channel_affine_impl<T, 1>(p, q, y, coef, out, nv, c, vs, vc, m1, m2, sh1, sh2, small,    \
                                      lanes, k, relu);                                               \
        }                                                                                            \
    }                                                                                                \
    extern "C" __global__ void channel_affine_lanes_##S(const T* p, const T* y,                     \
                                                        const stat_t<T>::type* coef, T* out,        \
                                                        i64 nv, i64 c, i64 vc, int k, int relu,     \
                                                        int vec) {                                  \
        CHANNEL_AFFINE_LANES(T, false, p, nullptr, y, coef, out, nv, c, vc, k, relu, vec);          \
    }                                                                                               \
    extern "C" __global__ void channel_affine_lanes_q_##S(const T* p, const T* q, const T* y,       \
                                                          const stat_t<T>::type* coef, T* out,      \
                                                          i64 nv, i64 c, i64 vc, int k,             \
                                                          int relu, int vec) {                      \
        CHANNEL_AFFINE_LANES(T, true, p, q, y, coef, out, nv, c, vc, k, relu, vec);                 \
    }                                                                                               \
    extern "C" __global__ void channel_cols_##S(const T* g, const T* y, const T* x,                 \
                                                const stat_t<T>::type* mean, double* part, i64 m,    \
                                                i64 c, i64 rows, int dot) {                          \
        channel_cols_impl(g, y, x, mean, part, m, c, rows, dot);                                     \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(256, 2)                                             \
        channel_cols_vec_##S(const T* g, const T* y, const T* x, const stat_t<T>::type* mean,        \
                             double* part, i64 m, i64 c, i64 rows, int dot) {                        \
        channel_cols_vec_impl<T, 16 / sizeof(T)>(g, y, x, mean, part, m, c, rows, dot);              \
    }                                                                                                \
    extern "C" __global__ void channel_sums_finish_##S(const double* part, const T* x,              \
                                                       stat_t<T>::type* out, i64 chunks, i64 m,     \
                                                       i64 c, i64 s, int dot) {                      \
        channel_sums_finish_impl(part, x, out, chunks, m, c, s, dot);                                \
    }
EMBER_FLOAT_TYPES(CHANNEL_OPS)

// Batch normalisation's per-channel coefficients, a thread a channel, in double
// and rounded once to S: coef's rows a = w * invstd, d = b - mean * a and
// invstd = 1 / sqrt(var + eps) (a null w is 1, a null b 0). Non-null running
// statistics rm and rv move towards the batch's: r = (1 - m) * r + m * batch,
// the variance made unbiased by `unbiased` = n / (n - 1).
template <typename S>
__device__ void batch_norm_coefs_impl(const S* mean, const S* var, const S* w, const S* b, S* rm,
                                      S* rv, S* coef, i64 c, double eps, double m,
                                      double unbiased) {
    FOR_EACH(ch, c) {
        const double mu = (double)mean[ch], v = (double)var[ch];
        const double invstd = 1.0 / sqrt(v + eps);
        const double a = w ? (double)w[ch] * invstd : invstd;
        coef[ch] = (S)a;
        coef[c + ch] = (S)((b ? (double)b[ch] : 0.0) - mu * a);
        coef[2 * c + ch] = (S)invstd;
        if (rm) rm[ch] = (S)((1.0 - m) * (double)rm[ch] + m * mu);
        if (rv) rv[ch] = (S)((1.0 - m) * (double)rv[ch] + m * (v * unbiased));
    }
}

// Batch normalisation's backward coefficients, a thread a channel, in double and
// rounded once to S: coef's rows k = w * invstd, q and d such that the input's
// gradient is g * k + x * q + d, from the sums' rows sum_g and sum_gx (sums[ch],
// sums[c + ch]) over `count` values a channel; with count 0 (running
// statistics) q = d = 0. gw (when non-null) gets the weight's gradient
// sum_gx * invstd.
template <typename S>
__device__ void batch_norm_grad_coefs_impl(const S* sums, const S* mean, const S* inv, const S* w,
                                           S* coef, S* gw, i64 c, double count) {
    FOR_EACH(ch, c) {
        const double sg = (double)sums[ch], sgx = (double)sums[c + ch], iv = (double)inv[ch];
        const double k = w ? (double)w[ch] * iv : iv;
        double q = 0.0, d = 0.0;
        if (count > 0.0) {
            // dx = k (g - sum_g / m - (x - mean) invstd^2 sum_gx / m)
            q = -k * iv * iv * sgx / count;
            d = -k * sg / count - (double)mean[ch] * q;
        }
        coef[ch] = (S)k;
        coef[c + ch] = (S)q;
        coef[2 * c + ch] = (S)d;
        if (gw) gw[ch] = (S)(sgx * iv);
    }
}

#define BATCH_NORM_COEFS(S, N)                                                                       \
    extern "C" __global__ void batch_norm_coefs_##N(const S* mean, const S* var, const S* w,       \
                                                    const S* b, S* rm, S* rv, S* coef, i64 c,       \
                                                    double eps, double m, double unbiased) {        \
        batch_norm_coefs_impl(mean, var, w, b, rm, rv, coef, c, eps, m, unbiased);                   \
    }                                                                                                \
    extern "C" __global__ void batch_norm_grad_coefs_##N(const S* sums, const S* mean,             \
                                                         const S* inv, const S* w, S* coef, S* gw,  \
                                                         i64 c, double count) {                     \
        batch_norm_grad_coefs_impl(sums, mean, inv, w, coef, gw, c, count);                          \
    }
IF_f32(BATCH_NORM_COEFS(float, f32)) IF_f64(BATCH_NORM_COEFS(double, f64))

// Cumulative sum (S_SUM) or product (S_PROD) along the middle axis of
// (outer, n, inner) contiguous elements: one thread per line (long lines in
// chunks, below). float32 accumulates in double, as the CPU does (PyTorch's CPU
// kernels accumulate it so); int64 wraps.
template <typename T> struct scan_t { typedef typename acc_t<T>::type type; };
template <> struct scan_t<float> { typedef double type; };

__device__ __forceinline__ i64 scan_step(int op, i64 a, i64 x) {
    return op == S_SUM ? wrap_add(a, x) : wrap_mul(a, x);
}
template <typename A> __device__ __forceinline__ A scan_step(int op, A a, A x) {
    return op == S_SUM ? a + x : a * x;
}

template <typename T>
__device__ __forceinline__ void cumulative_impl(const T* x, T* y, i64 outer, i64 n, i64 inner, int op) {
    typedef typename scan_t<T>::type A;
    FOR_EACH(t, outer * inner) {
        const i64 base = (t / inner) * n * inner + t % inner;
        A acc = op == S_SUM ? (A)0 : (A)1;
        for (i64 j = 0; j < n; j++) {
            acc = scan_step(op, acc, (A)widen(x[base + j * inner]));
            y[base + j * inner] = narrow<T>(acc);
        }
    }
}

#define CUMULATIVE(T, S)                                                                             \
    extern "C" __global__ void cumulative_##S(const T* x, T* out, i64 outer, i64 n, i64 inner,      \
                                              int op) {                                              \
        cumulative_impl(x, out, outer, n, inner, op);                                                \
    }
EMBER_FLOAT_TYPES(CUMULATIVE)
IF_i64(CUMULATIVE(i64, i64))

// Long lines scan in chunks of `chunk` elements (`chunks` of them a line), in three
// launches: a thread per chunk folds its chunk into `acc[line * chunks + c]`; a
// thread per line turns those totals into what comes before each chunk; a thread
// per chunk scans its chunk again from that carry. Consecutive threads take
// consecutive inner positions, as the serial kernel does. `acc` holds `A`s.
template <typename T>
__device__ __forceinline__ void cumulative_totals_impl(const T* x, typename scan_t<T>::type* acc, i64 outer, i64 n,
                                                       i64 inner, i64 chunk, i64 chunks, int op) {
    typedef typename scan_t<T>::type A;
    FOR_EACH(t, outer * chunks * inner) {
        const i64 i = t % inner, c = (t / inner) % chunks, o = t / (inner * chunks);
        const i64 base = o * n * inner + i, end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        A a = op == S_SUM ? (A)0 : (A)1;
        for (i64 j = c * chunk; j < end; j++) {
            a = scan_step(op, a, (A)widen(x[base + j * inner]));
        }
        acc[(o * inner + i) * chunks + c] = a;
    }
}

template <typename A>
__device__ __forceinline__ void cumulative_carries_impl(A* acc, i64 lines, i64 chunks, int op) {
    FOR_EACH(l, lines) {
        A* row = acc + l * chunks;
        A carry = op == S_SUM ? (A)0 : (A)1;
        for (i64 c = 0; c < chunks; c++) {
            const A total = row[c];
            row[c] = carry;
            carry = scan_step(op, carry, total);
        }
    }
}

template <typename T>
__device__ __forceinline__ void cumulative_chunks_impl(const T* x, T* y, const typename scan_t<T>::type* acc, i64 outer,
                                                       i64 n, i64 inner, i64 chunk, i64 chunks, int op) {
    typedef typename scan_t<T>::type A;
    FOR_EACH(t, outer * chunks * inner) {
        const i64 i = t % inner, c = (t / inner) % chunks, o = t / (inner * chunks);
        const i64 base = o * n * inner + i, end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        A a = acc[(o * inner + i) * chunks + c];
        for (i64 j = c * chunk; j < end; j++) {
            a = scan_step(op, a, (A)widen(x[base + j * inner]));
            y[base + j * inner] = narrow<T>(a);
        }
    }
}

#define CUMULATIVE_CHUNKED(T, S)                                                                     \
    extern "C" __global__ void cumulative_totals_##S(const T* x, scan_t<T>::type* acc, i64 outer,   \
                                                     i64 n, i64 inner, i64 chunk, i64 chunks,        \
                                                     int op) {                                       \
        cumulative_totals_impl(x, acc, outer, n, inner, chunk, chunks, op);                          \
    }                                                                                                \
    extern "C" __global__ void cumulative_carries_##S(scan_t<T>::type* acc, i64 lines, i64 chunks,  \
                                                      int op) {                                      \
        cumulative_carries_impl(acc, lines, chunks, op);                                             \
    }                                                                                                \
    extern "C" __global__ void cumulative_chunks_##S(const T* x, T* out, const scan_t<T>::type* acc, \
                                                     i64 outer, i64 n, i64 inner, i64 chunk,         \
                                                     i64 chunks, int op) {                           \
        cumulative_chunks_impl(x, out, acc, outer, n, inner, chunk, chunks, op);                     \
    }
EMBER_FLOAT_TYPES(CUMULATIVE_CHUNKED)
IF_i64(CUMULATIVE_CHUNKED(i64, i64))

// argsort: the thread of element (o, j, i) counts the elements of its line that
// sort before it (ties: the smaller index first, a stable sort; NaN above every
// number) and writes j at that rank. Every element has a distinct rank, so each
// output is written once.
template <typename A> __device__ __forceinline__ bool sorts_before(A a, i64 ia, A b, i64 ib, int desc) {
    const bool na = is_nan(a), nb = is_nan(b);
    if (na || nb) {
        if (na && nb) return ia < ib;
        return desc ? na : nb;  // NaN is the largest
    }
    if (a == b) return ia < ib;
    return desc ? a > b : a < b;
}

template <typename T>
__device__ __forceinline__ void argsort_impl(const T* x, i64* out, i64 total, i64 n, i64 inner, int desc) {
    FOR_EACH(t, total) {
        const i64 i = t % inner, j = (t / inner) % n, o = t / (inner * n);
        const i64 base = o * n * inner + i;
        const auto v = widen(x[t]);
        i64 rank = 0;
        for (i64 k = 0; k < n; k++) {
            if (sorts_before(widen(x[base + k * inner]), k, v, j, desc)) rank++;
        }
        out[base + rank * inner] = j;
    }
}

#define ARGSORT(T, S)                                                                                \
    extern "C" __global__ void argsort_##S(const T* x, i64* out, i64 total, i64 n, i64 inner,       \
                                           int desc) {                                               \
        argsort_impl(x, out, total, n, inner, desc);                                                 \
    }
EMBER_ALL_TYPES(ARGSORT)

// argsort of long lines: merge passes. Pass `width` merges neighbouring sorted
// runs of `width` indices (`in`, or the identity on the first pass) into runs of
// 2 * width (`out`). The thread of position j finds its index's place in the
// merged run by a binary search of the neighbouring run: the elements there that
// sort before it. (key, original index) is a total order, so every index lands on
// a distinct place and the result is the stable sort. log2(n) passes of
// O(log width) per element, where the counting above is O(n) per element.
__device__ __forceinline__ i64 merge_idx(const i64* in, int first, i64 base, i64 p, i64 inner) {
    return first ? p : in[base + p * inner];
}

template <typename T>
__device__ __forceinline__ void argsort_merge_impl(const T* x, const i64* in, i64* out, i64 total, i64 n, i64 inner,
                                                   i64 width, int first, int desc) {
    FOR_EACH(t, total) {
        const i64 i = t % inner, j = (t / inner) % n, o = t / (inner * n);
        const i64 base = o * n * inner + i;
        const i64 me = merge_idx(in, first, base, j, inner);
        const auto v = widen(x[base + me * inner]);
        const i64 run = j / width, start = run * width, pstart = (run ^ 1) * width;
        i64 pos = j;
        if (pstart < n) {
            const i64 plen = pstart + width < n ? width : n - pstart;
            i64 lo = 0, hi = plen;
            while (lo < hi) {
                const i64 mid = lo + ((hi - lo) >> 1);
                const i64 k = merge_idx(in, first, base, pstart + mid, inner);
                if (sorts_before(widen(x[base + k * inner]), k, v, me, desc)) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            pos = (start < pstart ? start : pstart) + (j - start) + lo;
        }
        out[base + pos * inner] = me;
    }
}

#define ARGSORT_MERGE(T, S)                                                                          \
    extern "C" __global__ void argsort_merge_##S(const T* x, const i64* in, i64* out, i64 total,    \
                                                 i64 n, i64 inner, i64 width, int first, int desc) { \
        argsort_merge_impl(x, in, out, total, n, inner, width, first, desc);                         \
    }
EMBER_ALL_TYPES(ARGSORT_MERGE)

// searchsorted: the thread of value i (row i / per of `val`, contiguous) searches
// row i / per of `seq` (m elements, contiguous) as PyTorch's lower/upper bound
// does (the same midpoints), so a sequence holding NaNs gives PyTorch's answer:
// an element goes before the value unless it is at or above it (above it, with
// `right`), which puts a NaN value after every element.
template <typename T>
__device__ __forceinline__ void searchsorted_impl(const T* seq, const T* val, i64* out, i64 m, i64 per, int right,
                                                  i64 n) {
    FOR_EACH(i, n) {
        const T* s = seq + (i / per) * m;
        const auto v = widen(val[i]);
        i64 lo = 0, hi = m;
        while (lo < hi) {
            const i64 mid = lo + ((hi - lo) >> 1);
            const auto x = widen(s[mid]);
            const bool before = right ? !(x > v) : !(x >= v);
            if (before) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        out[i] = lo;
    }
}

#define SEARCHSORTED(T, S)                                                                           \
    extern "C" __global__ void searchsorted_##S(const T* seq, const T* val, i64* out, i64 m, i64 per, \
                                                int right, i64 n) {                                  \
        searchsorted_impl(seq, val, out, m, per, right, n);                                          \
    }
EMBER_ALL_TYPES(SEARCHSORTED)

// Gradient clipping's 2-norm over the tensors of a TensorList (common.cuh; array
// 0 is each gradient). clip_sumsq writes each chunk's sum of squares (in the accumulator type),
// clip_norms each tensor's norm from its chunks' sums, and clip_scale multiplies
// every tensor by min(1, max_norm / (total + 1e-6)), that factor computed as
// tensor ops compute it (each step rounded) and rounded to the tensors' dtype.
template <typename T> __device__ void clip_sumsq_impl(TensorList l, typename acc_t<T>::type* partial) {
    typedef typename acc_t<T>::type A;
    __shared__ A sv[32];
    const i64 chunks = l.first_chunk[l.count];
    i64 t = 0;
    for (i64 k = blockIdx.x; k < chunks; k += gridDim.x) {
        i64 start, end;
        chunk_of(k, l, t, start, end);
        const T* x = (const T*)l.a[0][t];
        A s = (A)0;
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
            const A v = widen(x[i]);
            s += v * v;
        }
        s = block_sum(s, sv);
        if (threadIdx.x == 0) partial[k] = s;
    }
}

template <typename T>
__device__ void clip_norms_impl(TensorList l, const typename acc_t<T>::type* partial,
                                typename acc_t<T>::type* norms) {
    typedef typename acc_t<T>::type A;
    FOR_EACH(t, l.count) {
        A s = (A)0;
        for (i64 k = l.first_chunk[t]; k < l.first_chunk[t + 1]; ++k) s += partial[k];
        norms[t] = sqrt(s);
    }
}

template <typename T>
__device__ void clip_scale_impl(TensorList l, const typename acc_t<T>::type* total, double max_norm) {
    typedef typename acc_t<T>::type A;
    const A shifted = total[0] + (A)1e-6;
    const A inv = (A)1 / shifted;
    A c = inv * (A)max_norm;
    if (c > (A)1) c = (A)1;
    const A ct = widen(narrow<T>(c));
    const i64 chunks = l.first_chunk[l.count];
    i64 t = 0;
    for (i64 k = blockIdx.x; k < chunks; k += gridDim.x) {
        i64 start, end;
        chunk_of(k, l, t, start, end);
        T* x = (T*)l.a[0][t];
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) x[i] = narrow<T>(widen(x[i]) * ct);
    }
}

#define CLIP(T, S)                                                                                   \
    extern "C" __global__ void clip_sumsq_##S(TensorList l, acc_t<T>::type* partial) {                \
        clip_sumsq_impl<T>(l, partial);                                                              \
    }                                                                                                \
    extern "C" __global__ void clip_norms_##S(TensorList l, const acc_t<T>::type* partial,            \
                                              acc_t<T>::type* norms) {                               \
        clip_norms_impl<T>(l, partial, norms);                                                       \
    }                                                                                                \
    extern "C" __global__ void clip_scale_##S(TensorList l, const acc_t<T>::type* total,              \
                                              double max_norm) {                                     \
        clip_scale_impl<T>(l, total, max_norm);                                                      \
    }
IF_f32(CLIP(float, f32)) IF_f64(CLIP(double, f64))
