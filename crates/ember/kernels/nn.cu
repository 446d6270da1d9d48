// Indexing kernels and the fused Adam update.

// out (contiguous, shape of src with shape[dim] = n_idx) = src picked along dim.
// `lo` is src's layout with shape[dim] replaced by n_idx and strides[dim] by 0.
template <typename T>
__device__ void index_select_impl(const T* src, Layout lo, i64 dim_stride, int dim, const i64* idx, T* out, i64 n) {
    FOR_EACH(i, n) {
        i64 k;  // position along dim of output element i
        const i64 at = loc_at(lo, i, dim, k);
        out[i] = src[at + idx[k] * dim_stride];
    }
}

// out[p] = src[p with dim replaced by idx[p]] over idx's (contiguous) shape; `lo`
// is src's layout cut to idx's shape with strides[dim] = 0.
template <typename T>
__device__ void gather_impl(const T* src, Layout lo, i64 dim_stride, const i64* idx, T* out, i64 n) {
    FOR_EACH(i, n) { out[i] = src[loc(lo, i) + idx[i] * dim_stride]; }
}

// The bits of a 1- or 2-byte value, and back.
__device__ __forceinline__ unsigned small_bits(u8 v) { return v; }
__device__ __forceinline__ unsigned small_bits(bool v) { return v ? 1u : 0u; }
__device__ __forceinline__ unsigned small_bits(f16 v) { return v.bits; }
__device__ __forceinline__ unsigned small_bits(bf16 v) { return v.bits; }
template <typename T> struct from_small_bits;
template <> struct from_small_bits<u8> {
    static __device__ __forceinline__ u8 get(unsigned b) { return (u8)b; }
};
template <> struct from_small_bits<bool> {
    static __device__ __forceinline__ bool get(unsigned b) { return b != 0; }
};
template <> struct from_small_bits<f16> {
    static __device__ __forceinline__ f16 get(unsigned b) { f16 r; r.bits = (u16)b; return r; }
};
template <> struct from_small_bits<bf16> {
    static __device__ __forceinline__ bf16 get(unsigned b) { bf16 r; r.bits = (u16)b; return r; }
};

// Atomic `*p += v` for 1- and 2-byte types, which have no atomicAdd of their own:
// a compare-and-swap loop, computing the sum like the CPU: in float for f16/bf16,
// wrapping for u8, `or` for bool. 2-byte elements swap on their own (16-bit
// atomicCAS, sm_70+); bytes on the aligned 32-bit word that holds them, which the
// driver's allocation granularity always covers (ember's uncached allocations are
// rounded up to 4 bytes for the same reason).
template <typename T> __device__ __forceinline__ void atomic_add_small(T* p, T v) {
    if (sizeof(T) == 2) {
        unsigned short* half = (unsigned short*)p;
        unsigned short old = *half, assumed;
        do {
            assumed = old;
            T next = narrow<T>(widen(from_small_bits<T>::get(assumed)) + widen(v));
            old = atomicCAS(half, assumed, (unsigned short)small_bits(next));
        } while (assumed != old);
        return;
    }
    size_t addr = (size_t)p;
    unsigned* word = (unsigned*)(addr & ~(size_t)3);
    unsigned shift = (unsigned)(addr & 3) * 8;
    unsigned mask = 0xffu << shift;
    unsigned old = *word, assumed;
    do {
        assumed = old;
        T cur = from_small_bits<T>::get((assumed & mask) >> shift);
        T next = narrow<T>(widen(cur) + widen(v));
        old = atomicCAS(word, assumed, (assumed & ~mask) | ((small_bits(next) << shift) & mask));
    } while (assumed != old);
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i64* p, i64 v) {
    atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
__device__ __forceinline__ void atomic_add(u8* p, u8 v) { atomic_add_small(p, v); }
__device__ __forceinline__ void atomic_add(bool* p, bool v) { atomic_add_small(p, v); }
__device__ __forceinline__ void atomic_add(f16* p, f16 v) { atomic_add_small(p, v); }
__device__ __forceinline__ void atomic_add(bf16* p, bf16 v) { atomic_add_small(p, v); }

// dst[p with dim replaced by idx[p]] += src[p] over idx's shape; `ld` is the
// contiguous dst's layout cut to idx's shape with strides[dim] = 0, `ls` src's.
template <typename T>
__device__ void scatter_add_impl(T* dst, Layout ld, i64 dim_stride, const i64* idx, const T* src, Layout ls, i64 n) {
    FOR_EACH(i, n) { atomic_add(dst + loc(ld, i) + idx[i] * dim_stride, src[loc(ls, i)]); }
}

// dst[.., idx[j], ..] += src[.., j, ..] along `dim`: `ld` is the contiguous dst's
// layout cut to src's shape with strides[dim] = 0; src is contiguous, j is element
// i's coordinate along the dim.
template <typename T>
__device__ void index_add_impl(T* dst, Layout ld, i64 dim_stride, const i64* idx, int dim, const T* src,
                               i64 n) {
    FOR_EACH(i, n) {
        i64 j;
        const i64 at = loc_at(ld, i, dim, j);
        atomic_add(dst + at + idx[j] * dim_stride, src[i]);
    }
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

// Indices checked and wrapped on the device, so that a training step does not wait
// for the GPU to check them on the host: out[i] = idx[i], plus `size` where it is
// negative and `negative` allows that. An index outside [-size or 0, size) becomes
// 0 (no kernel after this one reads outside its tensor), and the first one found
// is written to the check's two flag words (1, the index) for the host to report
// at its next synchronisation.
extern "C" __global__ void check_indices(const i64* idx, Layout li, i64* out, i64 size, int negative,
                                         unsigned long long* flag, i64 n) {
    FOR_EACH(i, n) {
        i64 x = idx[loc(li, i)];
        i64 lo = negative ? -size : 0;
        if (x < lo || x >= size) {
            if (atomicCAS(flag, 0ull, 1ull) == 0ull) flag[1] = (unsigned long long)x;
            x = 0;
        } else if (x < 0) {
            x += size;
        }
        out[i] = x;
    }
}

#define SCATTER(T, S)                                                                                \
    extern "C" __global__ void scatter_add_##S(T* dst, Layout ld, i64 dim_stride, const i64* idx,   \
                                               const T* src, Layout ls, i64 n) {                     \
        scatter_add_impl(dst, ld, dim_stride, idx, src, ls, n);                                      \
    }
EMBER_ALL_TYPES(SCATTER)

#define INDEX_ADD(T, S)                                                                              \
    extern "C" __global__ void index_add_##S(T* dst, Layout ld, i64 dim_stride, const i64* idx,     \
                                             int dim, const T* src, i64 n) {                         \
        index_add_impl(dst, ld, dim_stride, idx, dim, src, n);                                       \
    }
EMBER_ALL_TYPES(INDEX_ADD)

// Integer matrix products (cuBLAS multiplies floats only): out (contiguous, batch x
// m x n) = a (batch x m x k) · b (batch x k x n), both broadcast layouts; the sum is
// taken in i64, wrapping, and narrowed like the CPU's.
template <typename T>
__device__ void matmul_int_impl(const T* a, Layout la, const T* b, Layout lb, T* out, i64 m, i64 k, i64 n,
                                i64 total) {
    FOR_EACH(o, total) {
        i64 j = o % n, i = (o / n) % m, bi = o / (m * n);
        i64 acc = 0;
        for (i64 l = 0; l < k; ++l) {
            i64 x = widen(a[loc(la, (bi * m + i) * k + l)]);
            i64 y = widen(b[loc(lb, (bi * k + l) * n + j)]);
            acc = wrap_add(acc, wrap_mul(x, y));
        }
        out[o] = narrow<T>(acc);
    }
}

#define MATMUL_INT(T, S)                                                                             \
    extern "C" __global__ void matmul_int_##S(const T* a, Layout la, const T* b, Layout lb, T* out, \
                                              i64 m, i64 k, i64 n, i64 total) {                     \
        matmul_int_impl(a, la, b, lb, out, m, k, n, total);                                          \
    }
IF_u8(MATMUL_INT(u8, u8)) IF_i64(MATMUL_INT(i64, i64))

// The constants of one Adam step, once per thread in T (double math is slow on
// most GPUs).
template <typename T> struct AdamConsts {
    T decay, wd, b1, b2, one_b1, one_b2, eps, sqrt_bc2, step;
    bool use_wd;
    int decoupled;
    __device__ AdamConsts(double lr, double b1_, double b2_, double eps_, double bc1, double bc2, double wd_,
                          int decoupled_)
        : decay((T)(1.0 - lr * wd_)), wd((T)wd_), b1((T)b1_), b2((T)b2_), one_b1((T)(1.0 - b1_)),
          one_b2((T)(1.0 - b2_)), eps((T)eps_), sqrt_bc2((T)sqrt(bc2)), step((T)(lr / bc1)),
          use_wd(wd_ != 0.0), decoupled(decoupled_) {}
};

// One element of an Adam (or AdamW when decoupled) step.
template <typename T>
__device__ __forceinline__ void adam_elem(T* p, const T* g, T* m, T* v, i64 i, const AdamConsts<T>& c) {
    T gi = g[i];
    T pi = p[i];
    if (c.use_wd) {
        if (c.decoupled) pi = pi * c.decay;
        else gi = gi + c.wd * pi;
    }
    T mi = c.b1 * m[i] + c.one_b1 * gi;
    T vi = c.b2 * v[i] + c.one_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    T denom = sqrt(vi) / c.sqrt_bc2 + c.eps;
    p[i] = pi - c.step * mi / denom;
}

// One Adam (or AdamW when decoupled) step on contiguous p, g, m, v of n elements.
template <typename T>
__device__ void adam_impl(T* p, const T* g, T* m, T* v, i64 n, double lr, double b1, double b2, double eps,
                          double bc1, double bc2, double wd, int decoupled) {
    const AdamConsts<T> c(lr, b1, b2, eps, bc1, bc2, wd, decoupled);
    FOR_EACH(i, n) { adam_elem(p, g, m, v, i, c); }
}

// Adam over the tensors of a TensorList (common.cuh): arrays 0-3 are each
// tensor's parameter, gradient and two moments. With `step` (the capturable
// form: the step count, float64, on the device, which a graph's replays advance)
// the bias corrections are 1 - b^step from it, else bc1 and bc2.
template <typename T>
__device__ void adam_multi_impl(TensorList l, const double* step, double lr, double b1, double b2, double eps,
                                double bc1, double bc2, double wd, int decoupled) {
    if (step) {
        const double t = *step;
        bc1 = 1.0 - pow(b1, t);
        bc2 = 1.0 - pow(b2, t);
    }
    const AdamConsts<T> c(lr, b1, b2, eps, bc1, bc2, wd, decoupled);
    const i64 chunks = l.first_chunk[l.count];
    i64 t = 0;
    for (i64 k = blockIdx.x; k < chunks; k += gridDim.x) {
        i64 start, end;
        chunk_of(k, l, t, start, end);
        T* p = (T*)l.a[0][t];
        const T* g = (const T*)l.a[1][t];
        T* m = (T*)l.a[2][t];
        T* v = (T*)l.a[3][t];
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) adam_elem(p, g, m, v, i, c);
    }
}

#define ADAM(T, S)                                                                                   \
    extern "C" __global__ void adam_##S(T* p, const T* g, T* m, T* v, i64 n, double lr, double b1,  \
                                        double b2, double eps, double bc1, double bc2, double wd,   \
                                        int decoupled) {                                             \
        adam_impl(p, g, m, v, n, lr, b1, b2, eps, bc1, bc2, wd, decoupled);                          \
    }                                                                                                \
    extern "C" __global__ void adam_multi_##S(TensorList l, const double* step, double lr, double b1,\
                                              double b2, double eps, double bc1, double bc2,        \
                                              double wd, int decoupled) {                            \
        adam_multi_impl<T>(l, step, lr, b1, b2, eps, bc1, bc2, wd, decoupled);                       \
    }
IF_f32(ADAM(float, f32)) IF_f64(ADAM(double, f64))

// SGD over the tensors of a TensorList (common.cuh): arrays 0-2 are each tensor's
// parameter, gradient and momentum buffer (unused without momentum); where its
// flag is set the buffer is written from the gradient, as PyTorch's first step
// clones it.
template <typename T>
__device__ void sgd_multi_impl(TensorList l, double lr, double momentum, double dampening, double wd,
                               int nesterov) {
    const T lr_t = (T)lr, mom = (T)momentum, keep = (T)(1.0 - dampening), wd_t = (T)wd;
    const bool use_wd = wd != 0.0, use_mom = momentum != 0.0;
    const i64 chunks = l.first_chunk[l.count];
    i64 t = 0;
    for (i64 k = blockIdx.x; k < chunks; k += gridDim.x) {
        i64 start, end;
        chunk_of(k, l, t, start, end);
        T* p = (T*)l.a[0][t];
        const T* g = (const T*)l.a[1][t];
        T* buf = (T*)l.a[2][t];
        const bool first = l.flag[t] != 0;
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
            T d = g[i];
            T pi = p[i];
            if (use_wd) d = d + wd_t * pi;
            if (use_mom) {
                T b = first ? d : mom * buf[i] + keep * d;
                buf[i] = b;
                d = nesterov ? d + mom * b : b;
            }
            p[i] = pi - lr_t * d;
        }
    }
}

#define SGD(T, S)                                                                                    \
    extern "C" __global__ void sgd_multi_##S(TensorList l, double lr, double momentum,              \
                                             double dampening,                                       \
                                             double wd, int nesterov) {                             \
        sgd_multi_impl<T>(l, lr, momentum, dampening, wd, nesterov);                                 \
    }
IF_f32(SGD(float, f32)) IF_f64(SGD(double, f64))
