// Convolution helpers (im2col / col2im for cuBLAS-based conv2d) and 2-D pooling,
// on contiguous NCHW tensors (pooling on NHWC ones too): im2col/col2im of f32 or
// f64, pooling of every float dtype.

// Geometry of one conv2d / pooling call (mirrors `KConv` in backend/cuda/ops/conv.rs).
struct Conv {
    i64 n, c, h, w;      // input
    i64 oh, ow;          // output plane
    i64 kh, kw, sh, sw, ph, pw, dh, dw;
    i64 nhwc;            // pooling: input and output channels-last (NHWC), else NCHW
};

// Where pooling output i reads: the input plane's first element `xp` (elements
// `xs` apart along a row), and the output's (oy, ox), for NCHW or NHWC arrays.
template <typename T> struct pool_at {
    const T* xp;
    i64 xs, oy, ox;
    __device__ pool_at(const T* x, const Conv& g, i64 i) {
        if (g.nhwc) {
            const i64 ch = i % g.c, r = i / g.c;
            ox = r % g.ow;
            oy = (r / g.ow) % g.oh;
            xp = x + r / (g.ow * g.oh) * g.h * g.w * g.c + ch;
            xs = g.c;
        } else {
            ox = i % g.ow;
            oy = (i / g.ow) % g.oh;
            xp = x + i / (g.ow * g.oh) * g.h * g.w;
            xs = 1;
        }
    }
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

// Pooling over `planes` = n*c planes, in T's accumulator type (float for f16/bf16,
// which are read and written in their own dtype).
//
// Max pooling's `index` gets, for each output, the position in its window
// (ki * kw + kj) of the first largest element, or of the first NaN: one byte per
// output where windows have at most 256 positions (`wide` 0), int64 otherwise.
template <typename T> __device__ void max_pool_impl(const T* x, Conv g, T* out, void* index, int wide) {
    typedef typename acc_t<T>::type A;
    i64 total = g.n * g.c * g.oh * g.ow;
    FOR_EACH(i, total) {
        const pool_at<T> at(x, g, i);
        const T* xp = at.xp;
        i64 y0 = at.oy * g.sh - g.ph, x0 = at.ox * g.sw - g.pw;
        A m = (A)__int_as_float(0xff800000);  // -inf
        i64 best = -1;
        bool done = false;
        for (i64 ki = 0; ki < g.kh && !done; ++ki) {
            i64 iy = y0 + ki * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                i64 ix = x0 + kj * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                const A v = widen(xp[(iy * g.w + ix) * at.xs]);
                const i64 k = ki * g.kw + kj;
                if (best < 0) best = k;
                if (v > m || v != v) {
                    m = v;
                    best = k;
                    if (v != v) { done = true; break; }
                }
            }
        }
        out[i] = narrow<T>(m);
        if (index) {
            const i64 k = best < 0 ? 0 : best;
            if (wide) ((i64*)index)[i] = k;
            else ((u8*)index)[i] = (u8)k;
        }
    }
}

// v / d for v >= 0 and d >= 1, the common strides and dilations (1, 2) as shifts:
// a 64-bit division costs tens of instructions.
__device__ __forceinline__ i64 pool_div(i64 v, i64 d) { return d == 1 ? v : d == 2 ? v >> 1 : v / d; }

// The input gradient of a pooling, one thread per input element: gx[e] is the sum,
// in the accumulator type A, of `share(s, o, oy, ox, ki, kj)` over the outputs
// whose window holds e at tap (ki, kj) (o: the output's index in `gout`, at
// (oy, ox) of its plane), visited in the outputs' order (oy, then ox, ascending:
// the taps from the last to the first). Each element sums its own gradient: no
// atomics, and the same order of additions as the CPU's pass over the outputs.
// The outputs are found from the element's row and column: output row oy holds
// row iy at tap ki where oy · sh = iy + ph - ki · dh, so oy · sh lies in
// [iy + ph - (kh - 1) · dh, iy + ph] (and likewise for the columns), a division
// or two per element rather than per tap.
// NHWC arrays (g.nhwc) interleave the planes: an output's neighbours along a row
// are g.c elements apart.
template <typename T, typename F> __device__ __forceinline__ void pool_back(Conv g, T* gx, F share) {
    typedef typename acc_t<T>::type A;
    const i64 total = g.n * g.c * g.h * g.w;
    FOR_EACH(e, total) {
        i64 ix, iy, base, os;
        if (g.nhwc) {
            const i64 ch = e % g.c, r = e / g.c;
            ix = r % g.w;
            iy = (r / g.w) % g.h;
            base = r / (g.w * g.h) * g.oh * g.ow * g.c + ch;
            os = g.c;
        } else {
            ix = e % g.w;
            iy = (e / g.w) % g.h;
            base = e / (g.w * g.h) * g.oh * g.ow;
            os = 1;
        }
        A s = (A)0;
        const i64 ty1 = iy + g.ph, ty0 = ty1 - (g.kh - 1) * g.dh;
        const i64 tx1 = ix + g.pw, tx0 = tx1 - (g.kw - 1) * g.dw;
        const i64 oy0 = ty0 <= 0 ? 0 : pool_div(ty0 + g.sh - 1, g.sh);
        const i64 oy1 = min(pool_div(ty1, g.sh), g.oh - 1);
        const i64 ox0 = tx0 <= 0 ? 0 : pool_div(tx0 + g.sw - 1, g.sw);
        const i64 ox1 = min(pool_div(tx1, g.sw), g.ow - 1);
        for (i64 oy = oy0; oy <= oy1; ++oy) {
            const i64 dy = ty1 - oy * g.sh, ki = pool_div(dy, g.dh);  // dy = ki · dh, if a tap
            if (ki * g.dh != dy) continue;
            for (i64 ox = ox0; ox <= ox1; ++ox) {
                const i64 dx = tx1 - ox * g.sw, kj = pool_div(dx, g.dw);
                if (kj * g.dw != dx) continue;
                share(s, base + (oy * g.ow + ox) * os, oy, ox, ki, kj);
            }
        }
        gx[e] = narrow<T>(s);
    }
}

// Max pooling's: each output's gradient goes to the element at its recorded
// window position.
template <typename T>
__device__ void max_pool_back_impl(const T* gout, const void* index, int wide, Conv g, T* gx) {
    typedef typename acc_t<T>::type A;
    pool_back(g, gx, [&](A& s, i64 o, i64, i64, i64 ki, i64 kj) {
        const i64 k = wide ? ((const i64*)index)[o] : (i64)((const u8*)index)[o];
        if (k == ki * g.kw + kj) s += widen(gout[o]);
    });
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
    typedef typename acc_t<T>::type A;
    i64 total = g.n * g.c * g.oh * g.ow;
    FOR_EACH(i, total) {
        const pool_at<T> at(x, g, i);
        const T* xp = at.xp;
        i64 y0 = at.oy * g.sh - g.ph, x0 = at.ox * g.sw - g.pw;
        A s = (A)0;
        for (i64 ki = 0; ki < g.kh; ++ki) {
            i64 iy = y0 + ki * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                i64 ix = x0 + kj * g.dw;
                if (ix >= 0 && ix < g.w) s += widen(xp[(iy * g.w + ix) * at.xs]);
            }
        }
        out[i] = narrow<T>(s / (A)avg_divisor(g, y0, x0, include_pad));
    }
}

// Average pooling's: each output's gradient over its window's divisor, to every
// element of the window.
template <typename T> __device__ void avg_pool_back_impl(const T* gout, Conv g, T* gx, int include_pad) {
    typedef typename acc_t<T>::type A;
    pool_back(g, gx, [&](A& s, i64 o, i64 oy, i64 ox, i64, i64) {
        const i64 y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
        s += widen(gout[o]) / (A)avg_divisor(g, y0, x0, include_pad);
    });
}

#define CONV(T, S)                                                                                   \
    extern "C" __global__ void im2col_##S(const T* x, Conv g, T* col) { im2col_impl(x, g, col); }    \
    extern "C" __global__ void col2im_##S(const T* col, Conv g, T* x) { col2im_impl(col, g, x); }
#define POOL(T, S)                                                                                   \
    extern "C" __global__ void max_pool_##S(const T* x, Conv g, T* out, void* index, int wide) {     \
        max_pool_impl(x, g, out, index, wide);                                                       \
    }                                                                                                \
    extern "C" __global__ void max_pool_back_##S(const T* gout, const void* index, int wide, Conv g, \
                                                 T* gx) {                                            \
        max_pool_back_impl(gout, index, wide, g, gx);                                                \
    }                                                                                                \
    extern "C" __global__ void avg_pool_##S(const T* x, Conv g, T* out, int include_pad) {          \
        avg_pool_impl(x, g, out, include_pad);                                                       \
    }                                                                                                \
    extern "C" __global__ void avg_pool_back_##S(const T* gout, Conv g, T* gx, int include_pad) {   \
        avg_pool_back_impl(gout, g, gx, include_pad);                                                \
    }
IF_f32(CONV(float, f32) POOL(float, f32)) IF_f64(CONV(double, f64) POOL(double, f64))
IF_f16(POOL(f16, f16)) IF_bf16(POOL(bf16, bf16))
