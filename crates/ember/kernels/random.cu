// Random numbers on the device: Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC'11), a counter-based generator: block `c` of
// four 32-bit outputs is a pure function of (seed, c), so every thread computes its
// own values and a sequence never depends on the launch configuration.
//
// A draw of n values uses counters offset .. offset + ceil(n / per): `per` is 4
// values per counter for f32/f16/bf16 and 2 for f64 (53-bit doubles from pairs of
// words). Mirrors `philox4x32_10` in the tests of backend/cuda/ops/random.rs, which checks
// it against the published known-answer vectors.

struct Philox4 {
    unsigned v[4];
};

__device__ __forceinline__ unsigned mulhi32(unsigned a, unsigned b) {
    return (unsigned)(((u64)a * (u64)b) >> 32);
}

__device__ __forceinline__ Philox4 philox4x32_10(u64 counter, u64 seed) {
    unsigned c0 = (unsigned)counter, c1 = (unsigned)(counter >> 32), c2 = 0, c3 = 0;
    unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
    for (int r = 0; r < 10; ++r) {
        unsigned h0 = mulhi32(0xD2511F53u, c0), l0 = 0xD2511F53u * c0;
        unsigned h1 = mulhi32(0xCD9E8D57u, c2), l1 = 0xCD9E8D57u * c2;
        unsigned n0 = h1 ^ c1 ^ k0, n2 = h0 ^ c3 ^ k1;
        c0 = n0;
        c1 = l1;
        c2 = n2;
        c3 = l0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    Philox4 r;
    r.v[0] = c0;
    r.v[1] = c1;
    r.v[2] = c2;
    r.v[3] = c3;
    return r;
}

// [0, 1) from the top 24 bits of a word; (0, 1] from the same bits plus one step.
__device__ __forceinline__ float unit_f32(unsigned x) { return (float)(x >> 8) * 5.9604644775390625e-8f; }
__device__ __forceinline__ float unit_open_f32(unsigned x) { return ((float)(x >> 8) + 1.0f) * 5.9604644775390625e-8f; }
// [0, 1) and (0, 1] from 53 bits of two words.
__device__ __forceinline__ double unit_f64(unsigned a, unsigned b) {
    return (double)((((u64)a << 32) | b) >> 11) * 1.1102230246251565e-16;
}
__device__ __forceinline__ double unit_open_f64(unsigned a, unsigned b) {
    return ((double)((((u64)a << 32) | b) >> 11) + 1.0) * 1.1102230246251565e-16;
}

#define TWO_PI_F 6.2831853071795864769f
#define TWO_PI 6.2831853071795864769

// A uniform draw `v` in T; one that rounds up to `hi` becomes `lo`, so that samples
// stay in [lo, hi) in every dtype.
template <typename T> __device__ __forceinline__ T below(double v, double lo, double hi) {
    T t = narrow<T>(v);
    return (double)widen(t) < hi ? t : narrow<T>(lo);
}

// uniform: p0 + (p1 - p0) * u; normal: p0 + p1 * z (Box-Muller on pairs of uniforms).
template <typename T>
__device__ void random_impl(T* out, i64 n, u64 seed, u64 offset, int normal, double p0, double p1) {
    if constexpr (sizeof(T) == 8) {
        i64 groups = (n + 1) / 2;
        FOR_EACH(g, groups) {
            Philox4 r = philox4x32_10(offset + (u64)g, seed);
            double v[2];
            if (normal) {
                double rad = sqrt(-2.0 * log(unit_open_f64(r.v[0], r.v[1])));
                double ang = TWO_PI * unit_f64(r.v[2], r.v[3]);
                v[0] = p0 + p1 * rad * cos(ang);
                v[1] = p0 + p1 * rad * sin(ang);
            } else {
                v[0] = p0 + (p1 - p0) * unit_f64(r.v[0], r.v[1]);
                v[1] = p0 + (p1 - p0) * unit_f64(r.v[2], r.v[3]);
            }
            for (int j = 0; j < 2 && 2 * g + j < n; ++j)
                out[2 * g + j] = normal ? narrow<T>(v[j]) : below<T>(v[j], p0, p1);
        }
    } else {
        i64 groups = (n + 3) / 4;
        float lo = (float)p0, span = (float)(p1 - p0), mean = (float)p0, sd = (float)p1;
        FOR_EACH(g, groups) {
            Philox4 r = philox4x32_10(offset + (u64)g, seed);
            float v[4];
            if (normal) {
                for (int h = 0; h < 4; h += 2) {
                    float rad = sqrtf(-2.0f * logf(unit_open_f32(r.v[h])));
                    float ang = TWO_PI_F * unit_f32(r.v[h + 1]);
                    v[h] = mean + sd * rad * cosf(ang);
                    v[h + 1] = mean + sd * rad * sinf(ang);
                }
            } else {
                for (int h = 0; h < 4; ++h) v[h] = lo + span * unit_f32(r.v[h]);
            }
            for (int j = 0; j < 4 && 4 * g + j < n; ++j)
                out[4 * g + j] = normal ? narrow<T>(v[j]) : below<T>(v[j], p0, p1);
        }
    }
}

// randint: low + w % span for 64-bit words w, two per counter (a modulo bias
// below span / 2^64).
__device__ void randint_impl(i64* out, i64 n, u64 seed, u64 offset, i64 low, u64 span) {
    i64 groups = (n + 1) / 2;
    FOR_EACH(g, groups) {
        Philox4 r = philox4x32_10(offset + (u64)g, seed);
        u64 w[2] = {((u64)r.v[0] << 32) | r.v[1], ((u64)r.v[2] << 32) | r.v[3]};
        for (int j = 0; j < 2 && 2 * g + j < n; ++j) out[2 * g + j] = (i64)((u64)low + w[j] % span);
    }
}

extern "C" __global__ void randint_i64(i64* out, i64 n, u64 seed, u64 offset, i64 low, u64 span) {
    randint_impl(out, n, seed, offset, low, span);
}

extern "C" __global__ void randint_graph_i64(i64* out, i64 n, const u64* state, u64 intra, i64 low, u64 span) {
    randint_impl(out, n, state[0], state[1] + intra, low, span);
}

// The raw generator, for tests: out[4c .. 4c+3] = Philox4x32-10(offset + c, seed).
extern "C" __global__ void philox_raw(unsigned* out, i64 counters, u64 seed, u64 offset) {
    FOR_EACH(c, counters) {
        Philox4 r = philox4x32_10(offset + (u64)c, seed);
        for (int j = 0; j < 4; ++j) out[4 * c + j] = r.v[j];
    }
}

// random_graph_S: the same draws inside a CUDA graph, the seed and the first
// counter read from `state` (written before each replay) plus this draw's place in
// the graph, so that every replay draws new numbers.
#define RANDOM(T, S)                                                                                 \
    extern "C" __global__ void random_##S(T* out, i64 n, u64 seed, u64 offset, int normal, double p0, \
                                          double p1) {                                               \
        random_impl(out, n, seed, offset, normal, p0, p1);                                           \
    }                                                                                                \
    extern "C" __global__ void random_graph_##S(T* out, i64 n, const u64* state, u64 intra,          \
                                                int normal, double p0, double p1) {                  \
        random_impl(out, n, state[0], state[1] + intra, normal, p0, p1);                             \
    }
EMBER_FLOAT_TYPES(RANDOM)
