// ember's common kernel definitions, placed before every ember kernel source.
//
// No CUDA header is included: f16 and bf16 are 16-bit structs converted with PTX
// instructions, so ember's kernels compile with NVRTC alone, on any machine.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned char u8;
typedef unsigned short u16;

#define EMBER_MAX_RANK 8

// A strided view, passed to kernels by value (mirrors `KLayout` on the Rust side).
// Elements are addressed by their row-major linear index over `shape`, which is
// below the view's element count.
struct Layout {
    int rank;
    int contiguous;  // 1 when element i lives at offset + i
    i64 offset;
    i64 shape[EMBER_MAX_RANK];
    i64 strides[EMBER_MAX_RANK];
    // With `small` (fewer than 2^31 elements), a linear index is split into
    // coordinates in 32 bits, dividing by shape[d] as (umulhi(i, magic[d]) + i) >>
    // shift[d] instead of a 64-bit division (which takes dozens of instructions).
    unsigned magic[EMBER_MAX_RANK];
    unsigned char shift[EMBER_MAX_RANK];
    int small;
    int reserved;
};

#ifndef EMBER_SIMULATOR
__device__ __forceinline__ unsigned ember_umulhi(unsigned a, unsigned b) { return __umulhi(a, b); }
#else
__device__ __forceinline__ unsigned ember_umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
#endif

// The offset of element i of a strided view, and its coordinate along dimension
// `dim` (below the rank; -1 for none), found in the same pass: what the index
// kernels need for the index to read.
__device__ __forceinline__ i64 loc_at(const Layout& l, i64 i, int dim, i64& coord) {
    i64 off = l.offset;
    if (l.small) {
        unsigned u = (unsigned)i;
        unsigned c = 0;
#pragma unroll
        for (int d = EMBER_MAX_RANK - 1; d > 0; --d) {
            if (d < l.rank) {
                const unsigned q = (ember_umulhi(u, l.magic[d]) + u) >> l.shift[d];
                const unsigned r = u - q * (unsigned)l.shape[d];
                if (d == dim) c = r;
                off += (i64)r * l.strides[d];
                u = q;
            }
        }
        if (dim == 0) c = u;
        coord = c;
        return l.rank > 0 ? off + (i64)u * l.strides[0] : off;
    }
    coord = 0;
    for (int d = l.rank - 1; d >= 0; --d) {
        const i64 s = l.shape[d];
        const i64 r = i % s;
        if (d == dim) coord = r;
        off += r * l.strides[d];
        i /= s;
    }
    return off;
}

__device__ __forceinline__ i64 loc(const Layout& l, i64 i) {
    if (l.contiguous) return l.offset + i;
    i64 unused;
    return loc_at(l, i, -1, unused);
}

// The tensors of one multi-tensor launch (ember's foreach kernels, PyTorch's
// multi_tensor_apply), passed by value as a kernel parameter (2.7 KiB, within the
// 4 KiB a launch may pass): up to FOREACH_LIST tensors, each with up to four arrays
// of its n[t] elements (a parameter, its gradient, its state), a flag, and its
// chunks of FOREACH_CHUNK elements: chunk k of the launch belongs to the tensor t
// with first_chunk[t] <= k < first_chunk[t + 1].
#define FOREACH_LIST 48
#define FOREACH_CHUNK 65536
struct TensorList {
    u64 a[4][FOREACH_LIST];
    i64 n[FOREACH_LIST];
    i64 flag[FOREACH_LIST];
    i64 first_chunk[FOREACH_LIST + 1];
    i64 count;
};

// Chunk k of a launch over `l`: moves t forward to k's tensor (k only grows in a
// block's loop) and gives the chunk's elements [start, end).
__device__ __forceinline__ void chunk_of(i64 k, const TensorList& l, i64& t, i64& start, i64& end) {
    while (k >= l.first_chunk[t + 1]) ++t;
    start = (k - l.first_chunk[t]) * FOREACH_CHUNK;
    end = start + FOREACH_CHUNK < l.n[t] ? start + FOREACH_CHUNK : l.n[t];
}

// V elements of T, aligned to their size (one load or store of up to 16 bytes).
template <typename T, int V> struct alignas(sizeof(T) * V) VecN {
    T v[V];
};

// Grid-stride loop over n elements.
#define FOR_EACH(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

#ifdef EMBER_SIMULATOR
// ember's CPU simulator of CUDA (backend/cuda/sim) has no PTX: the same rounding in C.
__device__ __forceinline__ float f16_to_float(f16 x) { return __ember_sim_f16_to_f32(x.bits); }
__device__ __forceinline__ f16 float_to_f16(float f) {
    f16 r;
    r.bits = __ember_sim_f32_to_f16(f);
    return r;
}
#else
__device__ __forceinline__ float f16_to_float(f16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ f16 float_to_f16(float f) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
    return r;
}
#endif
__device__ __forceinline__ float bf16_to_float(bf16 x) {
    return __uint_as_float(((unsigned)x.bits) << 16);
}
// Round to nearest even: on sm_80 and later one `cvt` (NaN becomes the
// canonical 0x7fff, as PyTorch's CUDA kernels round it), elsewhere and on the
// simulator the same rounding in integer steps (NaN kept, quieted).
__device__ __forceinline__ bf16 float_to_bf16(float f) {
    bf16 r;
#if !defined(EMBER_SIMULATOR) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
#else
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = (u16)((u >> 16) | 0x40);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.bits = (u16)(u >> 16);
#endif
    return r;
}

template <typename T> struct is_float_t { static const bool value = false; };
template <> struct is_float_t<f16> { static const bool value = true; };
template <> struct is_float_t<bf16> { static const bool value = true; };
template <> struct is_float_t<float> { static const bool value = true; };
template <> struct is_float_t<double> { static const bool value = true; };

// The type arithmetic runs in: float for f16/bf16/f32, double for f64, i64 for
// the integer types and bool.
template <typename T> struct acc_t { typedef i64 type; };
template <> struct acc_t<f16> { typedef float type; };
template <> struct acc_t<bf16> { typedef float type; };
template <> struct acc_t<float> { typedef float type; };
template <> struct acc_t<double> { typedef double type; };

__device__ __forceinline__ float widen(f16 x) { return f16_to_float(x); }
__device__ __forceinline__ float widen(bf16 x) { return bf16_to_float(x); }
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ i64 widen(i64 x) { return x; }
__device__ __forceinline__ i64 widen(u8 x) { return (i64)x; }
__device__ __forceinline__ i64 widen(bool x) { return x ? 1 : 0; }

// Converts a widened value (float, double or i64) to T. Integer results wrap like
// Rust's `as` on in-range values; bool is `v != 0`.
template <typename T> struct narrow_t {
    template <typename V> static __device__ __forceinline__ T from(V v) { return (T)v; }
};
template <> struct narrow_t<f16> {
    template <typename V> static __device__ __forceinline__ f16 from(V v) { return float_to_f16((float)v); }
};
template <> struct narrow_t<bf16> {
    template <typename V> static __device__ __forceinline__ bf16 from(V v) { return float_to_bf16((float)v); }
};
template <> struct narrow_t<bool> {
    template <typename V> static __device__ __forceinline__ bool from(V v) { return v != (V)0; }
};
template <> struct narrow_t<u8> {
    template <typename V> static __device__ __forceinline__ u8 from(V v) { return (u8)(i64)v; }
};
template <typename T, typename V> __device__ __forceinline__ T narrow(V v) { return narrow_t<T>::from(v); }

template <typename V> __device__ __forceinline__ bool is_nan(V v) { return v != v; }

// Integer arithmetic that wraps like Rust's wrapping_* (signed overflow is undefined in C).
__device__ __forceinline__ i64 wrap_add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ i64 wrap_sub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
__device__ __forceinline__ i64 wrap_mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }

// ember compiles each kernel file once per dtype, defining EMBER_T_<suffix> (only
// what a program uses gets compiled); with no EMBER_T_* defined, every dtype is
// instantiated. IF_<suffix>(x) keeps x only in the module of that dtype.
#if !defined(EMBER_T_bool) && !defined(EMBER_T_u8) && !defined(EMBER_T_i64) && !defined(EMBER_T_f16) && \
    !defined(EMBER_T_bf16) && !defined(EMBER_T_f32) && !defined(EMBER_T_f64)
#define EMBER_T_bool
#define EMBER_T_u8
#define EMBER_T_i64
#define EMBER_T_f16
#define EMBER_T_bf16
#define EMBER_T_f32
#define EMBER_T_f64
#endif
#ifdef EMBER_T_bool
#define IF_bool(x) x
#else
#define IF_bool(x)
#endif
#ifdef EMBER_T_u8
#define IF_u8(x) x
#else
#define IF_u8(x)
#endif
#ifdef EMBER_T_i64
#define IF_i64(x) x
#else
#define IF_i64(x)
#endif
#ifdef EMBER_T_f16
#define IF_f16(x) x
#else
#define IF_f16(x)
#endif
#ifdef EMBER_T_bf16
#define IF_bf16(x) x
#else
#define IF_bf16(x)
#endif
#ifdef EMBER_T_f32
#define IF_f32(x) x
#else
#define IF_f32(x)
#endif
#ifdef EMBER_T_f64
#define IF_f64(x) x
#else
#define IF_f64(x)
#endif

// Instantiates `MACRO(type, suffix)` for every dtype of this module.
#define EMBER_ALL_TYPES(M)                                                                           \
    IF_bool(M(bool, bool)) IF_u8(M(u8, u8)) IF_i64(M(i64, i64)) IF_f16(M(f16, f16))                  \
        IF_bf16(M(bf16, bf16)) IF_f32(M(float, f32)) IF_f64(M(double, f64))
#define EMBER_FLOAT_TYPES(M) IF_f16(M(f16, f16)) IF_bf16(M(bf16, bf16)) IF_f32(M(float, f32)) IF_f64(M(double, f64))
