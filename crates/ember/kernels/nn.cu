// Indexing kernels and the fused Adam update.

// out (contiguous, shape of src with shape[dim] = n_idx) = src picked along dim.
// `lo` is src's layout with shape[dim] replaced by n_idx and strides[dim] by 0.
template <typename T>
__device__ void index_select_impl(const T* src, Layout lo, i64 dim_stride, int dim, const i64* idx, T* out, i64 n) {
    FOR_EACH(i, n) {
        // position along dim of output element i
        i64 inner = 1;
        for (int d = lo.rank - 1; d > dim; --d) inner *= lo.shape[d];
        i64 k = (i / inner) % lo.shape[dim];
        out[i] = src[loc(lo, i) + idx[k] * dim_stride];
    }
}

// out[p] = src[p with dim replaced by idx[p]] over idx's (contiguous) shape; `lo`
// is src's layout cut to idx's shape with strides[dim] = 0.
template <typename T>
__device__ void gather_impl(const T* src, Layout lo, i64 dim_stride, const i64* idx, T* out, i64 n) {
    FOR_EACH(i, n) { out[i] = src[loc(lo, i) + idx[i] * dim_stride]; }
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i64* p, i64 v) {
    atomicAdd((unsigned long long*)p, (unsigned long long)v);
}

// dst[p with dim replaced by idx[p]] += src[p] over idx's shape; `ld` is the
// contiguous dst's layout cut to idx's shape with strides[dim] = 0, `ls` src's.
template <typename T>
__device__ void scatter_add_impl(T* dst, Layout ld, i64 dim_stride, const i64* idx, const T* src, Layout ls, i64 n) {
    FOR_EACH(i, n) { atomic_add(dst + loc(ld, i) + idx[i] * dim_stride, src[loc(ls, i)]); }
}

#define INDEX(T, S)                                                                                  \
    extern "C" __global__ void index_select_##S(const T* src, Layout lo, i64 dim_stride, int dim,   \
                                                const i64* idx, T* out, i64 n) {                     \
        index_select_impl(src, lo, dim_stride, dim, idx, out, n);                                    \
    }                                                                                                \
    extern "C" __global__ void gather_##S(const T* src, Layout lo, i64 dim_stride, const i64* idx,  \
                                          T* out, i64 n) {                                           \
        gather_impl(src, lo, dim_stride, idx, out, n);                                               \
    }
EMBER_ALL_TYPES(INDEX)

#define SCATTER(T, S)                                                                                \
    extern "C" __global__ void scatter_add_##S(T* dst, Layout ld, i64 dim_stride, const i64* idx,   \
                                               const T* src, Layout ls, i64 n) {                     \
        scatter_add_impl(dst, ld, dim_stride, idx, src, ls, n);                                      \
    }
IF_f32(SCATTER(float, f32)) IF_f64(SCATTER(double, f64)) IF_i64(SCATTER(i64, i64))

// One Adam (or AdamW when decoupled) step on contiguous p, g, m, v of n elements.
template <typename T>
__device__ void adam_impl(T* p, const T* g, T* m, T* v, i64 n, double lr, double b1, double b2, double eps,
                          double bc1, double bc2, double wd, int decoupled) {
    FOR_EACH(i, n) {
        T gi = g[i];
        T pi = p[i];
        if (wd != 0.0) {
            if (decoupled) pi = pi * (T)(1.0 - lr * wd);
            else gi = gi + (T)wd * pi;
        }
        T mi = (T)b1 * m[i] + (T)(1.0 - b1) * gi;
        T vi = (T)b2 * v[i] + (T)(1.0 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        T denom = sqrt(vi) / (T)sqrt(bc2) + (T)eps;
        p[i] = pi - (T)(lr / bc1) * mi / denom;
    }
}

#define ADAM(T, S)                                                                                   \
    extern "C" __global__ void adam_##S(T* p, const T* g, T* m, T* v, i64 n, double lr, double b1,  \
                                        double b2, double eps, double bc1, double bc2, double wd,   \
                                        int decoupled) {                                             \
        adam_impl(p, g, m, v, n, lr, b1, b2, eps, bc1, bc2, wd, decoupled);                          \
    }
IF_f32(ADAM(float, f32)) IF_f64(ADAM(double, f64))
