// Convolution helpers (im2col / col2im for cuBLAS-based conv2d) and 2-D pooling,
// on contiguous NCHW tensors of f32 or f64.

// Geometry of one conv2d / pooling call (mirrors `KConv` in backend/cuda/ops/conv.rs).
struct Conv {
    i64 n, c, h, w;      // input
    i64 oh, ow;          // output plane
    i64 kh, kw, sh, sw, ph, pw, dh, dw;
};

// col[b, (ci*kh + ki)*kw + kj, oy*ow + ox] = x[b, ci, oy*sh - ph + ki*dh, ox*sw - pw + kj*dw]
// (0 outside the input).
template <typename T> __device__ void im2col_impl(const T* x, Conv g, T* col) {
    i64 p = g.oh * g.ow, k = g.c * g.kh * g.kw;
    i64 total = g.n * k * p;
    FOR_EACH(i, total) {
        i64 pos = i % p, r = (i / p) % k, b = i / (p * k);
        i64 oy = pos / g.ow, ox = pos % g.ow;
        i64 kj = r % g.kw, ki = (r / g.kw) % g.kh, ci = r / (g.kw * g.kh);
        i64 iy = oy * g.sh - g.ph + ki * g.dh, ix = ox * g.sw - g.pw + kj * g.dw;
        T v = (T)0;
        if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) v = x[((b * g.c + ci) * g.h + iy) * g.w + ix];
        col[i] = v;
    }
}

// The adjoint of im2col: x[b, ci, iy, ix] = sum of the col entries that read it.
template <typename T> __device__ void col2im_impl(const T* col, Conv g, T* x) {
    i64 p = g.oh * g.ow, k = g.c * g.kh * g.kw;
    i64 total = g.n * g.c * g.h * g.w;
    FOR_EACH(i, total) {
        i64 ix = i % g.w, iy = (i / g.w) % g.h, ci = (i / (g.w * g.h)) % g.c, b = i / (g.w * g.h * g.c);
        T s = (T)0;
        for (i64 ki = 0; ki < g.kh; ++ki) {
            i64 ty = iy + g.ph - ki * g.dh;
            if (ty < 0 || ty % g.sh != 0) continue;
            i64 oy = ty / g.sh;
            if (oy >= g.oh) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                i64 tx = ix + g.pw - kj * g.dw;
                if (tx < 0 || tx % g.sw != 0) continue;
                i64 ox = tx / g.sw;
                if (ox >= g.ow) continue;
                i64 r = (ci * g.kh + ki) * g.kw + kj;
                s += col[(b * k + r) * p + oy * g.ow + ox];
            }
        }
        x[i] = s;
    }
}

// Max pooling over `planes` = n*c planes; `index` gets the position in its plane of
// each output's element (the first largest, or the first NaN).
template <typename T> __device__ void max_pool_impl(const T* x, Conv g, T* out, i64* index) {
    i64 total = g.n * g.c * g.oh * g.ow;
    FOR_EACH(i, total) {
        i64 ox = i % g.ow, oy = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
        const T* xp = x + plane * g.h * g.w;
        i64 y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
        T m = (T)__int_as_float(0xff800000);  // -inf
        i64 best = -1;
        bool done = false;
        for (i64 ki = 0; ki < g.kh && !done; ++ki) {
            i64 iy = y0 + ki * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                i64 ix = x0 + kj * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                i64 a = iy * g.w + ix;
                T v = xp[a];
                if (best < 0) best = a;
                if (v > m || v != v) {
                    m = v;
                    best = a;
                    if (v != v) { done = true; break; }
                }
            }
        }
        out[i] = m;
        if (index) index[i] = best < 0 ? 0 : best;
    }
}

__device__ __forceinline__ void atomic_add_f(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add_f(double* p, double v) { atomicAdd(p, v); }

// gx (zeroed, planes*h*w) += g at the recorded positions.
template <typename T> __device__ void max_pool_back_impl(const T* gout, const i64* index, Conv g, T* gx) {
    i64 total = g.n * g.c * g.oh * g.ow;
    FOR_EACH(i, total) {
        i64 plane = i / (g.ow * g.oh);
        atomic_add_f(gx + plane * g.h * g.w + index[i], gout[i]);
    }
}

__device__ __forceinline__ i64 avg_divisor(Conv g, i64 y0, i64 x0, int include_pad) {
    if (include_pad) {
        i64 ye = min(y0 + g.kh, g.h + g.ph), xe = min(x0 + g.kw, g.w + g.pw);
        return (ye - y0) * (xe - x0);
    }
    i64 cy = 0, cx = 0;
    for (i64 ki = 0; ki < g.kh; ++ki) { i64 iy = y0 + ki * g.dh; cy += (iy >= 0 && iy < g.h); }
    for (i64 kj = 0; kj < g.kw; ++kj) { i64 ix = x0 + kj * g.dw; cx += (ix >= 0 && ix < g.w); }
    return cy * cx;
}

template <typename T> __device__ void avg_pool_impl(const T* x, Conv g, T* out, int include_pad) {
    i64 total = g.n * g.c * g.oh * g.ow;
    FOR_EACH(i, total) {
        i64 ox = i % g.ow, oy = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
        const T* xp = x + plane * g.h * g.w;
        i64 y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
        T s = (T)0;
        for (i64 ki = 0; ki < g.kh; ++ki) {
            i64 iy = y0 + ki * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                i64 ix = x0 + kj * g.dw;
                if (ix >= 0 && ix < g.w) s += xp[iy * g.w + ix];
            }
        }
        out[i] = s / (T)avg_divisor(g, y0, x0, include_pad);
    }
}

// gx (zeroed) += g / divisor over each output's window.
template <typename T> __device__ void avg_pool_back_impl(const T* gout, Conv g, T* gx, int include_pad) {
    i64 total = g.n * g.c * g.oh * g.ow;
    FOR_EACH(i, total) {
        i64 ox = i % g.ow, oy = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
        T* gp = gx + plane * g.h * g.w;
        i64 y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
        T v = gout[i] / (T)avg_divisor(g, y0, x0, include_pad);
        for (i64 ki = 0; ki < g.kh; ++ki) {
            i64 iy = y0 + ki * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                i64 ix = x0 + kj * g.dw;
                if (ix >= 0 && ix < g.w) atomic_add_f(gp + iy * g.w + ix, v);
            }
        }
    }
}

#define CONV(T, S)                                                                                   \
    extern "C" __global__ void im2col_##S(const T* x, Conv g, T* col) { im2col_impl(x, g, col); }    \
    extern "C" __global__ void col2im_##S(const T* col, Conv g, T* x) { col2im_impl(col, g, x); }    \
    extern "C" __global__ void max_pool_##S(const T* x, Conv g, T* out, i64* index) {                \
        max_pool_impl(x, g, out, index);                                                             \
    }                                                                                                \
    extern "C" __global__ void max_pool_back_##S(const T* gout, const i64* index, Conv g, T* gx) {  \
        max_pool_back_impl(gout, index, g, gx);                                                      \
    }                                                                                                \
    extern "C" __global__ void avg_pool_##S(const T* x, Conv g, T* out, int include_pad) {          \
        avg_pool_impl(x, g, out, include_pad);                                                       \
    }                                                                                                \
    extern "C" __global__ void avg_pool_back_##S(const T* gout, Conv g, T* gx, int include_pad) {   \
        avg_pool_back_impl(gout, g, gx, include_pad);                                                \
    }
IF_f32(CONV(float, f32)) IF_f64(CONV(double, f64))
