// Elementwise kernels: fill, strided copy, cast, unary, binary (broadcast through
// the layouts), in-place unary and binary, comparisons and where. One template per
// operation, instantiated for every dtype; the operation code is a uniform branch.

// The operation codes U_*, B_* and C_* are defined in front of this file when it
// is compiled, from the tables of ember's op vocabulary (backend/op).

template <typename T> __device__ __forceinline__ void fill_impl(T* out, i64 n, T v) {
    FOR_EACH(i, n) { out[i] = v; }
}

template <typename T>
__device__ __forceinline__ void copy_impl(const T* src, Layout ls, T* dst, Layout ld, i64 n) {
    FOR_EACH(i, n) { dst[loc(ld, i)] = src[loc(ls, i)]; }
}

// dst = src converted to D. A contiguous source is read and the result written
// V elements at a time (16 bytes of the wider type) where both are aligned to
// that; the rest, and strided sources, element by element.
template <typename S, typename D>
__device__ __forceinline__ void cast_impl(const S* src, Layout ls, D* dst, i64 n) {
    const int V = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
    i64 done = 0;
    if (ls.contiguous) {
        const S* s = src + ls.offset;
        if (((unsigned long long)s % (sizeof(S) * V)) == 0 && ((unsigned long long)dst % (sizeof(D) * V)) == 0) {
            const i64 nv = n / V;
            const VecN<S, V>* sv = (const VecN<S, V>*)s;
            VecN<D, V>* dv = (VecN<D, V>*)dst;
            FOR_EACH(j, nv) {
                const VecN<S, V> a = sv[j];
                VecN<D, V> b;
#pragma unroll
                for (int k = 0; k < V; ++k) b.v[k] = narrow<D>(widen(a.v[k]));
                dv[j] = b;
            }
            done = nv * V;
        }
        FOR_EACH(i, n - done) { dst[done + i] = narrow<D>(widen(s[done + i])); }
        return;
    }
    FOR_EACH(i, n) { dst[i] = narrow<D>(widen(src[loc(ls, i)])); }
}

// --- floating point ---------------------------------------------------------------

__device__ __forceinline__ float f_erf(float x) { return erff(x); }
__device__ __forceinline__ double f_erf(double x) { return erf(x); }

// --- special functions, in double (the CPU's backend/op/special.rs, same methods) --

__device__ __forceinline__ double ember_inf() { return __longlong_as_double(0x7ff0000000000000ll); }
__device__ __forceinline__ double ember_nan() { return __longlong_as_double(0x7ff8000000000000ll); }

// erf^-1(y): Winitzki's approximation, then three Halley steps on erf(x) - y
// (above |y| = 0.5 on (1 - |y|) - erfc(x), which keeps the tails accurate).
__device__ __forceinline__ double ember_erfinv(double y) {
    if (is_nan(y) || fabs(y) > 1.0) return ember_nan();
    if (fabs(y) == 1.0) return copysign(ember_inf(), y);
    if (y == 0.0) return y;
    const double pi = 3.14159265358979323846;
    const double a = fabs(y);
    double x;
    if (a < 1e-3) {
        x = 0.886226925452758 * (a + pi / 12.0 * a * a * a);
    } else {
        const double w = 0.147;
        const double l = log1p(-a * a);
        const double c = 2.0 / (pi * w) + 0.5 * l;
        x = sqrt(sqrt(c * c - l / w) - c);
    }
    for (int i = 0; i < 3; ++i) {
        const double f = a > 0.5 ? (1.0 - a) - erfc(x) : erf(x) - a;
        const double d = 1.1283791670955126 * exp(-x * x);  // 2/sqrt(pi) e^{-x^2}
        if (d == 0.0 || f == 0.0) break;
        x -= f / (d + x * f);
    }
    return copysign(x, y);
}

// digamma: reflection below 0, the recurrence up to 10, the asymptotic series.
__device__ __forceinline__ double ember_digamma(double x) {
    const double pi = 3.14159265358979323846;
    if (x == 0.0) return copysign(ember_inf(), -x);
    if (is_nan(x) || x == -ember_inf()) return ember_nan();
    double reflect = 0.0;
    if (x < 0.0) {
        if (x == floor(x)) return ember_nan();
        reflect = -pi / tan(pi * (x - floor(x)));
        x = 1.0 - x;
    }
    double shift = 0.0;
    while (x < 10.0) {
        shift -= 1.0 / x;
        x += 1.0;
    }
    const double z = 1.0 / (x * x);
    double series = 1.0 / 12.0;
    series = series * z - 691.0 / 32760.0;
    series = series * z + 1.0 / 132.0;
    series = series * z - 1.0 / 240.0;
    series = series * z + 1.0 / 252.0;
    series = series * z - 1.0 / 120.0;
    series = series * z + 1.0 / 12.0;
    return reflect + shift + log(x) - 0.5 / x - series * z;
}

// The Hurwitz zeta function by Euler-Maclaurin summation (terms added directly
// up to q + k >= 10 + s, then ten Bernoulli terms of the tail).
__device__ __forceinline__ double ember_hurwitz_zeta(double s, double q) {
    if (is_nan(q) || q == -ember_inf() || q < -1048576.0) return ember_nan();
    if (q <= 0.0 && q == floor(q)) return ember_inf();
    double a = q, sum = 0.0;
    while (a < 10.0 + s) {
        sum += pow(a, -s);
        a += 1.0;
    }
    const double b[10] = {1.0 / 12.0, -1.0 / 720.0, 1.0 / 30240.0, -1.0 / 1209600.0, 1.0 / 47900160.0,
                          -691.0 / 1307674368000.0, 1.0 / 74724249600.0, -3617.0 / 10670622842880000.0,
                          43867.0 / 5109094217170944000.0, -174611.0 / 802857662698291200000.0};
    const double a_s = pow(a, -s);
    double tail = a * a_s / (s - 1.0) + 0.5 * a_s;
    double rising = s * a_s / a;
    for (int j = 0; j < 10; ++j) {
        tail += b[j] * rising;
        const double k = 2.0 * (j + 1);
        rising *= (s + k - 1.0) * (s + k) / (a * a);
    }
    return sum + tail;
}

// the n-th derivative of digamma: (-1)^(n+1) n! zeta(n + 1, x)
__device__ __forceinline__ double ember_polygamma(int n, double x) {
    if (n == 0) return ember_digamma(x);
    double factorial = 1.0;
    for (int k = 2; k <= n; ++k) factorial *= (double)k;
    return (n % 2 == 1 ? 1.0 : -1.0) * factorial * ember_hurwitz_zeta((double)(n + 1), x);
}

template <typename A> __device__ __forceinline__ A unary_float(int op, A x, double p0, double p1) {
    switch (op) {
    case U_NEG: return -x;
    case U_ABS: return x < (A)0 ? -x : x;
    case U_EXP: return exp(x);
    case U_LOG: return log(x);
    case U_SQRT: return sqrt(x);
    case U_TANH: return tanh(x);
    case U_SIN: return sin(x);
    case U_COS: return cos(x);
    case U_RECIP: return (A)1 / x;
    case U_SQUARE: return x * x;
    case U_RELU: return (x > (A)0 || is_nan(x)) ? x : (A)0;
    case U_SIGMOID: return (A)1 / ((A)1 + exp(-x));
    case U_ERF: return f_erf(x);
    case U_GELU: return (A)0.5 * x * ((A)1 + f_erf(x * (A)0.70710678118654752440));
    case U_GELU_TANH: {
        const A k = (A)0.79788456080286535588;  // sqrt(2 / pi)
        return (A)0.5 * x * ((A)1 + tanh(k * (x + (A)0.044715 * x * x * x)));
    }
    case U_POW_SCALAR:
        if (p0 == 2.0) return x * x;
        if (p0 == 0.5) return sqrt(x);
        if (p0 == -0.5) return (A)1 / sqrt(x);
        if (p0 == 1.0) return x;
        return pow(x, (A)p0);
    case U_CLAMP: {
        A y = x;
        if (!is_nan(p0) && y < (A)p0) y = (A)p0;
        if (!is_nan(p1) && y > (A)p1) y = (A)p1;
        return y;
    }
    case U_SILU: return x / ((A)1 + exp(-x));
    case U_SOFTPLUS: {
        const A bx = x * (A)p0;
        return bx > (A)p1 ? x : log1p(exp(bx)) / (A)p0;
    }
    case U_ELU: return x > (A)0 ? x : expm1(x * (A)p1) * (A)p0;  // p1: the input's scale
    case U_LEAKY_RELU: return x > (A)0 ? x : x * (A)p0;
    case U_LOG1P: return log1p(x);
    case U_EXPM1: return expm1(x);
    case U_FLOOR: return floor(x);
    case U_CEIL: return ceil(x);
    case U_ROUND: return rint(x);  // halves to even
    case U_TRUNC: return trunc(x);
    case U_SIGN: return x > (A)0 ? (A)1 : (x < (A)0 ? (A)-1 : (A)0);  // NaN gives 0
    case U_RSQRT: return (A)1 / sqrt(x);
    case U_LOG2: return log2(x);
    case U_LOG10: return log10(x);
    case U_TAN: return tan(x);
    case U_ATAN: return atan(x);
    case U_HARDSIGMOID:
    case U_HARDSWISH: {
        // relu6(x + 3), NaN kept
        A r = x + (A)3;
        if (r < (A)0) r = (A)0;
        if (r > (A)6) r = (A)6;
        return op == U_HARDSWISH ? x * r / (A)6 : r / (A)6;
    }
    case U_SELU: {
        // the constants rounded to the accumulator type and multiplied in it
        const A scale = (A)1.0507009873554804934193349852946;
        return x > (A)0 ? x * scale : expm1(x) * ((A)1.6732632423543772848170429916717 * scale);
    }
    case U_MISH: return x * tanh(log1p(exp(x)));
    case U_SINH: return sinh(x);
    case U_COSH: return cosh(x);
    case U_ASIN: return asin(x);
    case U_ACOS: return acos(x);
    case U_ASINH: return asinh(x);
    case U_ACOSH: return acosh(x);
    case U_ATANH: return atanh(x);
    case U_ERFC: return erfc(x);
    case U_LGAMMA: return lgamma(x);
    case U_ERFINV: return (A)ember_erfinv((double)x);
    case U_DIGAMMA: return (A)ember_digamma((double)x);
    case U_POLYGAMMA: return (A)ember_polygamma((int)p0, (double)x);
    }
    return x;
}

// floor(a / b) from fmod, as the CPU computes it (a quotient just below an integer
// is not rounded up to it by the division)
template <typename A> __device__ __forceinline__ A floor_div(A a, A b) {
    if (b == (A)0) return a / b;
    const A m = fmod(a, b);
    A div = (a - m) / b;
    if (m != (A)0 && ((b < (A)0) != (m < (A)0))) div -= (A)1;
    if (div == (A)0) return copysign((A)0, a / b);
    A q = floor(div);
    if (div - q > (A)0.5) q += (A)1;
    return q;
}

template <typename A> __device__ __forceinline__ A binary_float(int op, A a, A b) {
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_MAXIMUM: return (is_nan(a) || is_nan(b)) ? (a + b) : (a > b ? a : b);
    case B_MINIMUM: return (is_nan(a) || is_nan(b)) ? (a + b) : (a < b ? a : b);
    case B_POW: return pow(a, b);
    case B_RELU_BACKWARD: return b > (A)0 ? a : (A)0;
    case B_ATAN2: return atan2(a, b);
    case B_REMAINDER: {
        A m = fmod(a, b);
        if (m != (A)0 && ((b < (A)0) != (m < (A)0))) m += b;
        return m;
    }
    case B_FMOD: return fmod(a, b);
    case B_FLOOR_DIVIDE: return floor_div(a, b);
    case B_GELU_BACKWARD: {
        // a · (Φ(b) + b·φ(b)): GELU's gradient a at its input b
        const A cdf = (A)0.5 * ((A)1 + erf(b * (A)0.70710678118654752440));
        const A pdf = exp((A)-0.5 * b * b) * (A)0.39894228040143267794;
        return a * (cdf + b * pdf);
    }
    case B_GELU_TANH_BACKWARD: {
        // a · G'(b) for G(x) = x (1 + tanh(β (x + κ x³))) / 2, PyTorch's terms
        const A beta = (A)0.79788456080286535588, kappa = (A)0.044715;
        const A x_sq = b * b;
        const A t = tanh(beta * (b + kappa * (x_sq * b)));
        const A left_derivative = (A)0.5 * ((A)1 + t);
        const A tanh_derivative = (A)1 - t * t;
        const A inner_derivative = beta * ((A)1 + (A)3 * kappa * x_sq);
        return a * (left_derivative + (A)0.5 * b * tanh_derivative * inner_derivative);
    }
    }
    return a;
}

// --- integers (computed in i64, wrapping like the CPU kernels) --------------------


__device__ __forceinline__ i64 int_pow(i64 a, i64 b) {
    if (b < 0) {
        if (a == 1) return 1;
        if (a == -1) return (b % 2 == 0) ? 1 : -1;
        return 0;
    }
    i64 r = 1;
    u64 e = (u64)b;
    while (e) {
        if (e & 1) r = wrap_mul(r, a);
        a = wrap_mul(a, a);
        e >>= 1;
    }
    return r;
}

__device__ __forceinline__ i64 unary_int(int op, i64 x, double p0, double p1) {
    switch (op) {
    case U_NEG: return wrap_sub(0, x);
    case U_ABS: return x < 0 ? wrap_sub(0, x) : x;
    case U_SQUARE: return wrap_mul(x, x);
    case U_RELU: return x > 0 ? x : 0;
    case U_SIGN: return x > 0 ? 1 : (x < 0 ? -1 : 0);
    case U_POW_SCALAR: return int_pow(x, (i64)p0);
    case U_CLAMP: {
        i64 y = x;
        if (!is_nan(p0)) { i64 lo = (i64)ceil(p0); if (y < lo) y = lo; }
        if (!is_nan(p1)) { i64 hi = (i64)floor(p1); if (y > hi) y = hi; }
        return y;
    }
    }
    // float-only operations reach here only through the float path
    return x;
}

__device__ __forceinline__ i64 binary_int(int op, i64 a, i64 b) {
    switch (op) {
    case B_ADD: return wrap_add(a, b);
    case B_SUB: return wrap_sub(a, b);
    case B_MUL: return wrap_mul(a, b);
    case B_DIV:
        if (b == 0 || (b == -1 && a == (i64)0x8000000000000000ull)) return 0;
        return a / b;
    case B_MAXIMUM: return a > b ? a : b;
    case B_MINIMUM: return a < b ? a : b;
    case B_POW: return int_pow(a, b);
    case B_RELU_BACKWARD: return b > 0 ? a : 0;
    // integer division by zero is refused before a kernel runs; 0 keeps it defined
    case B_REMAINDER: {
        if (b == 0) return 0;
        if (b == -1) return 0;
        const i64 m = a % b;
        return (m != 0 && ((b < 0) != (m < 0))) ? wrap_add(m, b) : m;
    }
    case B_FMOD: return (b == 0 || b == -1) ? 0 : a % b;
    case B_FLOOR_DIVIDE: {
        if (b == 0) return 0;
        if (b == -1) return wrap_sub(0, a);
        const i64 q = a / b;
        return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
    }
    }
    return a;
}

template <typename T> __device__ __forceinline__ T apply_unary(int op, T x, double p0, double p1) {
    if constexpr (is_float_t<T>::value) {
        return narrow<T>(unary_float(op, widen(x), p0, p1));
    } else {
        return narrow<T>(unary_int(op, widen(x), p0, p1));
    }
}

template <typename T> __device__ __forceinline__ T apply_binary(int op, T a, T b) {
    if constexpr (is_float_t<T>::value) {
        return narrow<T>(binary_float(op, widen(a), widen(b)));
    } else {
        return narrow<T>(binary_int(op, widen(a), widen(b)));
    }
}

// 16 bytes of T, loaded and stored as one access where the addresses allow it.
template <typename T> struct alignas(16) Vec16 {
    static const int N = 16 / sizeof(T);
    T v[N];
};

template <typename T> __device__ __forceinline__ bool aligned16(const T* p) {
    return ((unsigned long long)p & 15ull) == 0;
}

// out[i] = f(x[i]) over contiguous arrays, 16 bytes per access where both are
// aligned to 16 bytes (the rest, and unaligned arrays, element by element).
template <typename T, typename F> __device__ __forceinline__ void map1_contiguous(const T* x, T* out, i64 n, F f) {
    i64 done = 0;
    if (aligned16(x) && aligned16(out)) {
        const int N = Vec16<T>::N;
        const i64 nv = n / N;
        const Vec16<T>* xv = (const Vec16<T>*)x;
        Vec16<T>* ov = (Vec16<T>*)out;
        FOR_EACH(j, nv) {
            Vec16<T> a = xv[j];
#pragma unroll
            for (int k = 0; k < N; ++k) a.v[k] = f(a.v[k]);
            ov[j] = a;
        }
        done = nv * N;
    }
    FOR_EACH(i, n - done) { out[done + i] = f(x[done + i]); }
}

// out[i] = f(a[i], b[i]) over contiguous arrays, vectorised like map1_contiguous.
template <typename T, typename F>
__device__ __forceinline__ void map2_contiguous(const T* a, const T* b, T* out, i64 n, F f) {
    i64 done = 0;
    if (aligned16(a) && aligned16(b) && aligned16(out)) {
        const int N = Vec16<T>::N;
        const i64 nv = n / N;
        const Vec16<T>* av = (const Vec16<T>*)a;
        const Vec16<T>* bv = (const Vec16<T>*)b;
        Vec16<T>* ov = (Vec16<T>*)out;
        FOR_EACH(j, nv) {
            Vec16<T> x = av[j];
            const Vec16<T> y = bv[j];
#pragma unroll
            for (int k = 0; k < N; ++k) x.v[k] = f(x.v[k], y.v[k]);
            ov[j] = x;
        }
        done = nv * N;
    }
    FOR_EACH(i, n - done) { out[done + i] = f(a[done + i], b[done + i]); }
}

// The ops models run most. Their contiguous float kernels get the operation code
// as a constant, so that the op's switch folds away inside the 16-byte loop; a
// code known only at run time costs a switch per element (8 a vector of
// f16/bf16, 4 of f32). Other ops, integer types and strided layouts take the
// code at run time: DISPATCH_HOT(T, op, LIST, BODY) runs BODY(code) once, with
// the constant where LIST holds op.
#define HOT_UNARY(X, B)                                                                          \
    X(U_RELU, B) X(U_GELU, B) X(U_GELU_TANH, B) X(U_SILU, B) X(U_EXP, B) X(U_NEG, B) X(U_SQUARE, B) \
        X(U_SQRT, B) X(U_RSQRT, B) X(U_TANH, B) X(U_SIGMOID, B)
#define HOT_BINARY(X, B)                                                                         \
    X(B_ADD, B) X(B_SUB, B) X(B_MUL, B) X(B_DIV, B) X(B_MAXIMUM, B) X(B_RELU_BACKWARD, B)          \
        X(B_GELU_BACKWARD, B) X(B_GELU_TANH_BACKWARD, B)
#define HOT_CASE(C, B) \
    case C:            \
        B(C);          \
        return;
#define DISPATCH_HOT(T, op, LIST, BODY)                 \
    if constexpr (is_float_t<T>::value) {               \
        switch (op) {                                   \
            LIST(HOT_CASE, BODY)                        \
        default:                                        \
            break;                                      \
        }                                               \
    }                                                   \
    BODY(op)

template <typename T>
__device__ __forceinline__ void unary_impl(const T* x, Layout lx, T* out, i64 n, int op, double p0, double p1) {
    if (lx.contiguous) {
        const T* xs = x + lx.offset;
#define UNARY_MAP(C) map1_contiguous(xs, out, n, [=](T v) { return apply_unary(C, v, p0, p1); })
        DISPATCH_HOT(T, op, HOT_UNARY, UNARY_MAP);
#undef UNARY_MAP
    } else {
        FOR_EACH(i, n) { out[i] = apply_unary(op, x[loc(lx, i)], p0, p1); }
    }
}

// Each operand's layout is judged on its own: a contiguous one is read at
// offset + i, a broadcast or strided one through its coordinates.
template <typename T>
__device__ __forceinline__ void binary_impl(const T* a, Layout la, const T* b, Layout lb, T* out, i64 n, int op) {
    if (la.contiguous && lb.contiguous) {
        const T *as = a + la.offset, *bs = b + lb.offset;
#define BINARY_MAP(C) map2_contiguous(as, bs, out, n, [=](T x, T y) { return apply_binary(C, x, y); })
        DISPATCH_HOT(T, op, HOT_BINARY, BINARY_MAP);
#undef BINARY_MAP
    } else {
        FOR_EACH(i, n) { out[i] = apply_binary(op, a[loc(la, i)], b[loc(lb, i)]); }
    }
}

// The scalar operand of a tensor-scalar op, passed by value: floats as double,
// integers and bools as i64 (exact beyond 2^53), converted to T like a 0-d tensor.
template <typename T> __device__ __forceinline__ T scalar_as(double sf, i64 si) {
    if constexpr (is_float_t<T>::value) {
        return narrow<T>(sf);
    } else {
        return narrow<T>(si);
    }
}

// The scalar as each element's op sees it. An i64 scalar is passed through an
// empty asm, so that NVVM does not treat it as loop-invariant: it unswitched the
// 16-byte loop on every test of the scalar in the op's switch (b == 0, b == -1,
// b < 0, int_pow's loop, ...) and took 65 s of NVRTC's time for the i64 module
// alone (1.6 s with this). u8 and bool scalars are widened from 8 bits, so the
// sign tests fold (those modules take 5 s); floats take the op's code as a
// constant where it matters.
__device__ __forceinline__ i64 opaque_scalar(i64 b) {
#ifndef EMBER_SIMULATOR
    asm volatile("" : "+l"(b));
#endif
    return b;
}
template <typename T> __device__ __forceinline__ T opaque_scalar(T b) { return b; }

// The scalar of a scalar op as the op takes it. A float is widened to the type
// the op computes in (float for float16 and bfloat16): a product or quotient
// takes the number itself (PyTorch's opmath, so x * 1e-8 in float16 is not 0),
// the other ops take it rounded to the dtype first. These are PyTorch's CPU
// rules, which ember keeps on every device (PyTorch's own CUDA kernels may
// take the number unrounded in more ops, and divide by it as a product with
// its reciprocal: not measured here). Integers and bools keep T.
template <typename T> __device__ __forceinline__ auto scalar_operand(int op, double sf, i64 si) {
    if constexpr (is_float_t<T>::value) {
        typedef typename acc_t<T>::type W;
        return (op == B_MUL || op == B_DIV) ? (W)sf : widen(scalar_as<T>(sf, si));
    } else {
        return scalar_as<T>(sf, si);
    }
}

// op(a, b) for a scalar b from scalar_operand.
template <typename T, typename B> __device__ __forceinline__ T apply_binary_scalar(int op, T a, B b) {
    if constexpr (is_float_t<T>::value) {
        return narrow<T>(binary_float(op, widen(a), b));
    } else {
        return apply_binary(op, a, b);
    }
}

template <typename T>
__device__ __forceinline__ void binary_scalar_impl(const T* a, Layout la, T* out, i64 n, int op, double sf, i64 si) {
    const auto b = scalar_operand<T>(op, sf, si);
    if (la.contiguous) {
        const T* as = a + la.offset;
#define SCALAR_MAP(C) map1_contiguous(as, out, n, [=](T x) { return apply_binary_scalar(C, x, opaque_scalar(b)); })
        DISPATCH_HOT(T, op, HOT_BINARY, SCALAR_MAP);
#undef SCALAR_MAP
    } else {
        FOR_EACH(i, n) { out[i] = apply_binary_scalar(op, a[loc(la, i)], b); }
    }
}

// The in-place kernels: a contiguous target (and operand) 16 bytes at a time
// like the out-of-place ones (each thread reads and writes the same elements),
// any other layout element by element.
template <typename T>
__device__ __forceinline__ void unary_inplace_impl(T* a, Layout la, i64 n, int op, double p0, double p1) {
    if (la.contiguous) {
        T* p = a + la.offset;
#define UNARY_INPLACE_MAP(C) map1_contiguous(p, p, n, [=](T v) { return apply_unary(C, v, p0, p1); })
        DISPATCH_HOT(T, op, HOT_UNARY, UNARY_INPLACE_MAP);
#undef UNARY_INPLACE_MAP
    } else {
        FOR_EACH(i, n) {
            const i64 o = loc(la, i);
            a[o] = apply_unary(op, a[o], p0, p1);
        }
    }
}

template <typename T>
__device__ __forceinline__ void binary_scalar_inplace_impl(T* a, Layout la, i64 n, int op, double sf, i64 si) {
    const auto b = scalar_operand<T>(op, sf, si);
    if (la.contiguous) {
        T* p = a + la.offset;
#define SCALAR_INPLACE_MAP(C) map1_contiguous(p, p, n, [=](T x) { return apply_binary_scalar(C, x, opaque_scalar(b)); })
        DISPATCH_HOT(T, op, HOT_BINARY, SCALAR_INPLACE_MAP);
#undef SCALAR_INPLACE_MAP
    } else {
        FOR_EACH(i, n) {
            i64 o = loc(la, i);
            a[o] = apply_binary_scalar(op, a[o], b);
        }
    }
}

template <typename T>
__device__ __forceinline__ void binary_inplace_impl(T* a, Layout la, const T* b, Layout lb, i64 n, int op) {
    if (la.contiguous && lb.contiguous) {
        T* p = a + la.offset;
        const T* bs = b + lb.offset;
#define BINARY_INPLACE_MAP(C) map2_contiguous(p, bs, p, n, [=](T x, T y) { return apply_binary(C, x, y); })
        DISPATCH_HOT(T, op, HOT_BINARY, BINARY_INPLACE_MAP);
#undef BINARY_INPLACE_MAP
    } else {
        FOR_EACH(i, n) {
            i64 o = loc(la, i);
            a[o] = apply_binary(op, a[o], b[loc(lb, i)]);
        }
    }
}

template <typename V> __device__ __forceinline__ bool apply_compare(int op, V x, V y) {
    switch (op) {
    case C_EQ: return x == y;
    case C_NE: return x != y;
    case C_LT: return x < y;
    case C_LE: return x <= y;
    case C_GT: return x > y;
    case C_GE: return x >= y;
    }
    return false;
}

template <typename T>
__device__ __forceinline__ void compare_impl(const T* a, Layout la, const T* b, Layout lb, bool* out, i64 n, int op) {
    FOR_EACH(i, n) { out[i] = apply_compare(op, widen(a[loc(la, i)]), widen(b[loc(lb, i)])); }
}

template <typename T>
__device__ __forceinline__ void compare_scalar_impl(const T* a, Layout la, bool* out, i64 n, int op, double sf,
                                                    i64 si) {
    auto y = widen(scalar_as<T>(sf, si));
    FOR_EACH(i, n) { out[i] = apply_compare(op, widen(a[loc(la, i)]), y); }
}

template <typename T>
__device__ __forceinline__ void where_impl(const bool* c, Layout lc, const T* a, Layout la, const T* b, Layout lb, T* out, i64 n) {
    FOR_EACH(i, n) { out[i] = c[loc(lc, i)] ? a[loc(la, i)] : b[loc(lb, i)]; }
}

#define ELEMENTWISE(T, S)                                                                            \
    extern "C" __global__ void fill_##S(T* out, i64 n, T v) { fill_impl(out, n, v); }                \
    extern "C" __global__ void copy_##S(const T* src, Layout ls, T* dst, Layout ld, i64 n) {        \
        copy_impl(src, ls, dst, ld, n);                                                              \
    }                                                                                                \
    extern "C" __global__ void unary_##S(const T* x, Layout lx, T* out, i64 n, int op, double p0,   \
                                         double p1) {                                                \
        unary_impl(x, lx, out, n, op, p0, p1);                                                       \
    }                                                                                                \
    extern "C" __global__ void unary_inplace_##S(T* a, Layout la, i64 n, int op, double p0,         \
                                                 double p1) {                                        \
        unary_inplace_impl(a, la, n, op, p0, p1);                                                    \
    }                                                                                                \
    extern "C" __global__ void binary_##S(const T* a, Layout la, const T* b, Layout lb, T* out,     \
                                          i64 n, int op) {                                           \
        binary_impl(a, la, b, lb, out, n, op);                                                       \
    }                                                                                                \
    extern "C" __global__ void binary_inplace_##S(T* a, Layout la, const T* b, Layout lb, i64 n,    \
                                                  int op) {                                          \
        binary_inplace_impl(a, la, b, lb, n, op);                                                    \
    }                                                                                                \
    extern "C" __global__ void binary_scalar_##S(const T* a, Layout la, T* out, i64 n, int op,      \
                                                 double sf, i64 si) {                                \
        binary_scalar_impl(a, la, out, n, op, sf, si);                                               \
    }                                                                                                \
    extern "C" __global__ void binary_scalar_inplace_##S(T* a, Layout la, i64 n, int op, double sf, \
                                                         i64 si) {                                   \
        binary_scalar_inplace_impl(a, la, n, op, sf, si);                                            \
    }                                                                                                \
    extern "C" __global__ void compare_##S(const T* a, Layout la, const T* b, Layout lb, bool* out, \
                                           i64 n, int op) {                                          \
        compare_impl(a, la, b, lb, out, n, op);                                                      \
    }                                                                                                \
    extern "C" __global__ void compare_scalar_##S(const T* a, Layout la, bool* out, i64 n, int op,  \
                                                  double sf, i64 si) {                               \
        compare_scalar_impl(a, la, out, n, op, sf, si);                                              \
    }                                                                                                \
    extern "C" __global__ void where_##S(const bool* c, Layout lc, const T* a, Layout la,           \
                                         const T* b, Layout lb, T* out, i64 n) {                     \
        where_impl(c, lc, a, la, b, lb, out, n);                                                     \
    }
EMBER_ALL_TYPES(ELEMENTWISE)

// first + step * i for i in 0..n, int64, wrapping around as two's complement
// (the ranges, index and mask tensors built on the device)
extern "C" __global__ void iota_i64(i64* out, i64 n, i64 first, i64 step) {
    FOR_EACH(i, n) { out[i] = (i64)((u64)first + (u64)step * (u64)i); }
}

// linspace's values in float64: the first `half` forward from start, the rest
// backward from end, each one fused multiply-add (one rounding, as the host's)
extern "C" __global__ void linspace_f64(double* out, i64 n, double start, double end, double step, i64 half) {
    FOR_EACH(i, n) { out[i] = i < half ? fma(step, (double)i, start) : fma(-step, (double)(n - 1 - i), end); }
}

// cast_<from>_<to> for every pair of dtypes
#define CAST_TO(D, DS, S, SS)                                                                        \
    extern "C" __global__ void cast_##SS##_##DS(const S* src, Layout ls, D* dst, i64 n) {           \
        cast_impl(src, ls, dst, n);                                                                  \
    }
#define CAST_FROM(S, SS)                                                                             \
    CAST_TO(bool, bool, S, SS) CAST_TO(u8, u8, S, SS) CAST_TO(i64, i64, S, SS)                       \
    CAST_TO(f16, f16, S, SS) CAST_TO(bf16, bf16, S, SS) CAST_TO(float, f32, S, SS)                   \
    CAST_TO(double, f64, S, SS)
EMBER_ALL_TYPES(CAST_FROM)
