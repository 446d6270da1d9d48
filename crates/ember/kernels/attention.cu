// Fused attention (FlashAttention's algorithm) on tensor cores:
// softmax(q kᵀ · scale) v over tiles of queries and keys, never writing the
// [L, S] scores, with the row statistics kept in float32; and its backward, which
// recomputes the weights from each row's log-sum-exp.
//
// The products are warp-wide `mma.sync` (sm_80 and later) with float32
// accumulators: m16n8k16 on f16/bf16 operands, and for float32 operands three
// m16n8k8 tf32 products per step (each operand split into its leading tf32 bits
// and its remainder rounded to tf32, the product of the two remainders dropped:
// float32's accuracy at tensor-core speed, as PyTorch's float32 attention does;
// tf32_split).
// A warp owns 16 rows of a tile; its lane `lane` holds, of an accumulator tile
// of 16 x 8, the elements (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
// with g = lane / 4, t = lane % 4 (PTX's fragment layout). A product's result
// feeds the next product as its A operand without leaving the registers (the
// weights into `· v`, the scores' gradient into `· k`).
//
// Operands are [batch, heads, rows, d] views whose last dim is contiguous, with
// element strides (batch, head, row) of whole 16 bytes; so are the results,
// written where their strides put them (the output with the heads inside the
// rows, the gradients so or packed in one buffer: backend/op/attention.rs); `d` is a multiple of 8
// up to the kernel's DM (64 or 128), the columns
// beyond `d` read as zeros and are never written. Rows past a sequence's end are
// masked. An additive bias (a mask: `-inf` hides a key) may be added to the
// scaled scores; a query row it leaves with no key gets zeros and a log-sum-exp
// of -inf, and no gradient.
//
// Kernels (S = dtype suffix, D = DM):
//   attn_fwd_S_dD      grid (batch·heads, L/64): out [.., L, d] and lse [.., L]
//                      (contiguous)
//                      (natural log of each row's sum of exp(scaled scores))
//   attn_dot_S         D[row] = Σ dout · out (float32), the softmax backward's term
//   attn_bwd_kv_S_dD   grid (batch·heads, S/64): dk, dv (each key block loops
//                      over the query blocks that see it)
//   attn_bwd_q_S_dD    grid (batch·heads, L/64): dq
// The backward makes no atomic adds: each gradient element has one writer, so
// the results do not depend on the order blocks run in.
//
// Each kernel holds a block's fixed rows (the queries in the forward) in
// registers and streams the other operand's rows through shared tiles, a step
// of them at a time: their copies (`cp.async`) are queued a step ahead, so they
// run while the products of the step before run (attn_steps, AttnPipe), and the
// products read the tiles as they lie, f16/bf16 through `ldmatrix` (attn_tile). The fwd/bwd kernels
// come twice: as named, and `attn_fwd_masked_S_dD` etc. that add the bias.

#define ATT_THREADS 128
#define ATT_LOG2E 1.4426950408889634f

struct AttnArgs {
    i64 q_off, k_off, v_off;
    i64 qs[3], ks[3], vs[3];  // element strides of (batch, head, row)
    int heads, l, s, d;
    float scale;  // the scores' scale (1/sqrt(d) by default)
    int causal;   // 1: query i sees keys 0..=i
    u64 seed;     // of the dropout masks
    unsigned drop_threshold;  // a weight is dropped where its 24-bit draw is below (0: no dropout)
    float keep_scale;         // 1 / (1 - p), the kept weights' factor
    i64 bias_off;             // the additive bias (a T pointer passed beside, may be null):
    i64 bias_st[4];           // element strides of (batch, head, query, key), 0 where it broadcasts
    i64 os[3];                // element strides of (batch, head, row) of the output
    i64 dqs[3], dkvs[3];      // the same of dq, and of dk and dv (each pointer at its view's start)
};

// splitmix64's finaliser: a 64-bit mix of every input bit.
__device__ __forceinline__ u64 attn_mix(u64 z) {
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The dropout factor of weight (qi, kj) of the pair `pair_hash` (attn_mix(seed ^
// bh)): 0 where dropped, 1 / (1 - p) where kept, the same in forward and backward
// (and on the CPU, backend/cpu/attention.rs).
__device__ __forceinline__ float attn_keep(const AttnArgs& a, u64 pair_hash, int qi, int kj) {
    if (a.drop_threshold == 0) return 1.f;
    const u64 h = attn_mix(pair_hash ^ (((u64)(unsigned)qi << 32) | (u64)(unsigned)kj));
    return (unsigned)(h >> 40) < a.drop_threshold ? 0.f : a.keep_scale;
}

struct __align__(16) vec16 {
    unsigned a, b, c, d;
};

// What the kernels need of an operand type T: E, the element as it lies in
// memory (the 16-bit pattern of f16/bf16, a float); K, the inner dim of one
// product step; HI, how far (in elements) an operand fragment's second register
// lies from its first along the inner dim. An operand register holds 2 elements
// of f16/bf16 (columns c, c + 1) or one float32.
//
// For float32 the inner dim of a step is taken in the order 0, 2, 4, 6, 1, 3, 5,
// 7: PTX puts (row, k) and (row, k + 4) in a lane's registers, ember puts columns
// 2t and 2t + 1 there, for the A operand and the B operand alike, so that the
// product is the same and an accumulator tile's (g, 2t), (g, 2t + 1) are the
// next product's A registers as they stand.
template <typename T> struct attn_t;
template <> struct attn_t<f16> {
    typedef u16 E;
    static const int K = 16, HI = 8;
};
template <> struct attn_t<bf16> {
    typedef u16 E;
    static const int K = 16, HI = 8;
};
template <> struct attn_t<float> {
    typedef float E;
    static const int K = 8, HI = 1;
};

// Whether T is bf16 (else f16): picks the mma's operand type.
template <typename T> struct mma_is_bf16 { static const bool value = false; };
template <> struct mma_is_bf16<bf16> { static const bool value = true; };

template <typename T> __device__ __forceinline__ float half_bits_to_float(unsigned b);
template <> __device__ __forceinline__ float half_bits_to_float<bf16>(unsigned b) {
    return __uint_as_float((b & 0xffffu) << 16);
}
template <> __device__ __forceinline__ float half_bits_to_float<f16>(unsigned b) {
    f16 h;
    h.bits = (u16)(b & 0xffffu);
    return f16_to_float(h);
}

// Two floats rounded to T (f16 or bf16) and packed as an operand register (the
// first in the low half: the smaller column). On the GPU one `cvt` rounds and
// packs both (PTX puts its first source in the high half); the simulator rounds
// each as narrow<T> does, to the same bits (NaN aside: the GPU's is canonical).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
    static_assert(sizeof(typename attn_t<T>::E) == 2, "pack2 packs two 16-bit halves");
#if !defined(EMBER_SIMULATOR) && __CUDA_ARCH__ >= 800
    unsigned r;
    if (mma_is_bf16<T>::value) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
#else
    const T a = narrow<T>(lo), b = narrow<T>(hi);
    return (unsigned)a.bits | ((unsigned)b.bits << 16);
#endif
}

// 2^x for the softmax's weights and rescaling: on sm_80 and later the
// multi-function unit's one instruction, its results below 2^-126 flushed to 0
// (exp2f adds a rescaling around it for them: three more instructions a
// weight). Forward, such a weight adds nothing to a row's sum of at least 1;
// backward, it would add less than 2^-126 · |dout| to a key's gradients.
// exp2f on the simulator.
__device__ __forceinline__ float attn_exp2(float x) {
#if !defined(EMBER_SIMULATOR) && __CUDA_ARCH__ >= 800
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// The operand register at `p` (two 16-bit elements, or one float).
__device__ __forceinline__ unsigned op_reg(const u16* p) { return *(const unsigned*)p; }
__device__ __forceinline__ unsigned op_reg(const float* p) { return __float_as_uint(*p); }

// Stores the columns c, c + 1 of a result row at `p`, rounded to T.
template <typename T> __device__ __forceinline__ void store2(u16* p, float x, float y) {
    *(unsigned*)p = pack2<T>(x, y);
}
template <typename T> __device__ __forceinline__ void store2(float* p, float x, float y) {
    p[0] = x;
    p[1] = y;
}

// c += a · b by the warp-wide `mma.sync.aligned.<shape and types>`, accumulating
// in place: c (4 floats), a (4 registers), b (2 registers).
#define ATT_MMA(shape_types)                                                                     \
    asm volatile("mma.sync.aligned." shape_types " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "      \
                 "{%0,%1,%2,%3};\n"                                                             \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

#ifdef EMBER_SIMULATOR
// The simulator's matrix instructions: a lane's A and B fragments, which every
// lane of the warp publishes at once (one warp-wide exchange, where a shuffle
// per element would be 32); f[i] is lane i's (this lane's own for a lane that
// has exited, as a shuffle reads).
struct sim_frag {
    unsigned a[4], b[2];
    sim_frag(const unsigned* a_, const unsigned* b_) : a{a_[0], a_[1], a_[2], a_[3]}, b{b_[0], b_[1]} {}
};
static inline void sim_frags(const sim_frag& mine, const sim_frag* f[32]) {
    const void* lanes[32];
    __ember_sim_warp_all(&mine, sizeof mine, lanes);
    for (int i = 0; i < 32; ++i) f[i] = lanes[i] ? (const sim_frag*)lanes[i] : &mine;
}
#endif

// c += a · b for one 16 x 8 x 16 tile of f16/bf16: a (16 x 16, rows) as 4
// registers of 2 elements, b (16 x 8, columns) as 2, c (16 x 8) as 4 floats, in
// the lane layout above (a[0]: (g, 2t..), a[1]: (g + 8, 2t..), a[2]: (g, 2t + 8..),
// a[3]: (g + 8, 2t + 8..); b[0]: rows 2t.., column g; b[1]: rows 2t + 8..).
template <typename T> __device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
#ifdef EMBER_SIMULATOR
    // the simulator: each lane gathers its rows of a and columns of b from the
    // lanes that hold them
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const sim_frag mine(a, b);
    const sim_frag* f[32];
    sim_frags(mine, f);
    for (int k = 0; k < 16; k += 2) {
        const int owner = (k & 7) >> 1;
        const unsigned alo = f[g * 4 + owner]->a[k < 8 ? 0 : 2];
        const unsigned ahi = f[g * 4 + owner]->a[k < 8 ? 1 : 3];
        const unsigned b0 = f[(2 * t) * 4 + owner]->b[k < 8 ? 0 : 1];
        const unsigned b1 = f[(2 * t + 1) * 4 + owner]->b[k < 8 ? 0 : 1];
        const float a00 = half_bits_to_float<T>(alo), a01 = half_bits_to_float<T>(alo >> 16);
        const float a10 = half_bits_to_float<T>(ahi), a11 = half_bits_to_float<T>(ahi >> 16);
        const float b00 = half_bits_to_float<T>(b0), b10 = half_bits_to_float<T>(b0 >> 16);
        const float b01 = half_bits_to_float<T>(b1), b11 = half_bits_to_float<T>(b1 >> 16);
        c[0] += a00 * b00 + a01 * b10;
        c[1] += a00 * b01 + a01 * b11;
        c[2] += a10 * b00 + a11 * b10;
        c[3] += a10 * b01 + a11 * b11;
    }
#elif __CUDA_ARCH__ >= 800
    if (mma_is_bf16<T>::value) {
        ATT_MMA("m16n8k16.row.col.f32.bf16.bf16.f32");
    } else {
        ATT_MMA("m16n8k16.row.col.f32.f16.f16.f32");
    }
#else
    // ember launches these kernels on sm_80 and later only
    __trap();
#endif
}

// x (float32 bits) as big + small for three tf32 products, split as PyTorch's
// float32 attention splits it (CUTLASS's fast float32 products): big is x with
// the 13 low bits of its mantissa cleared; small is the rest, x - big (exact),
// with half of tf32's last place added to its bits, so that the tensor cores,
// which ignore an operand's 13 low bits, read it rounded to nearest. Three
// instructions an element; rounding both parts with cvt.rna took about ten.
// Its error is about that of float32 multiply-adds, twice the old split's
// (bench/tf32_split_error.py).
// An inf or NaN x has an inf or NaN big part, so its products are not finite
// either; its small part, x - big, is NaN (the GPU's 0x7fffffff, which the
// addition carries into -0): the simulator makes its NaN the GPU's, so that it
// computes the same.
__device__ __forceinline__ void tf32_split(unsigned x, unsigned& big, unsigned& small) {
#if defined(EMBER_SIMULATOR) || __CUDA_ARCH__ < 800
    big = x & 0xffffe000u;
    const float s = __uint_as_float(x) - __uint_as_float(big);
    small = (s != s ? 0x7fffffffu : __float_as_uint(s)) + 0x1000u;
#else
    // volatile: split where a product takes the fragment, not hoisted out of the
    // step loops, where the split fragments of a warp's fixed rows would hold
    // twice their registers
    asm volatile("and.b32 %0, %1, 0xffffe000;\n" : "=r"(big) : "r"(x));
    small = __float_as_uint(__uint_as_float(x) - __uint_as_float(big)) + 0x1000u;
#endif
}

// c += a · b for one 16 x 8 x 8 tile of tf32 operands (PTX's layout: a[0]:
// (g, t), a[1]: (g + 8, t), a[2]: (g, t + 4), a[3]: (g + 8, t + 4); b[0]: row t,
// column g; b[1]: row t + 4).
__device__ __forceinline__ void mma1688(float* c, const unsigned* a, const unsigned* b) {
#ifdef EMBER_SIMULATOR
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const sim_frag mine(a, b);
    const sim_frag* f[32];
    sim_frags(mine, f);
    for (int k = 0; k < 8; ++k) {
        const int owner = k & 3;
        const float a0 = __uint_as_float(f[g * 4 + owner]->a[k < 4 ? 0 : 2] & 0xffffe000u);
        const float a1 = __uint_as_float(f[g * 4 + owner]->a[k < 4 ? 1 : 3] & 0xffffe000u);
        const float b0 = __uint_as_float(f[(2 * t) * 4 + owner]->b[k < 4 ? 0 : 1] & 0xffffe000u);
        const float b1 = __uint_as_float(f[(2 * t + 1) * 4 + owner]->b[k < 4 ? 0 : 1] & 0xffffe000u);
        c[0] += a0 * b0;
        c[1] += a0 * b1;
        c[2] += a1 * b0;
        c[3] += a1 * b1;
    }
#elif __CUDA_ARCH__ >= 800
    ATT_MMA("m16n8k8.row.col.f32.tf32.tf32.f32");
#else
    __trap();
#endif
}

// An A fragment (4 registers) as a product step takes it: f16/bf16's as they
// are; float32's split into tf32 parts (tf32_split). A fragment meets every
// accumulator tile of a product (the loops over `n` in mma_rows and mma_cols):
// split once there, not per tile.
template <typename T> struct mma_a {
    unsigned r[4];
    __device__ __forceinline__ explicit mma_a(const unsigned* a) {
#pragma unroll
        for (int i = 0; i < 4; ++i) r[i] = a[i];
    }
};
template <> struct mma_a<float> {
    unsigned big[4], small[4];
    __device__ __forceinline__ explicit mma_a(const unsigned* a) {
#pragma unroll
        for (int i = 0; i < 4; ++i) tf32_split(a[i], big[i], small[i]);
    }
};

// c += a · b for one product step of T's operands (b: 2 registers).
template <typename T> __device__ __forceinline__ void mma(float* c, const mma_a<T>& a, const unsigned* b) {
    mma16816<T>(c, a.r, b);
}
// float32: b split as a is, and a · b = a_big · b_big + a_big · b_small +
// a_small · b_big (the smaller terms first; the product of the smalls dropped).
template <> __device__ __forceinline__ void mma<float>(float* c, const mma_a<float>& a, const unsigned* b) {
    unsigned bb[2], bs[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) tf32_split(b[i], bb[i], bs[i]);
    mma1688(c, a.small, bb);
    mma1688(c, a.big, bs);
    mma1688(c, a.big, bb);
}

// The A fragment of inner step kk from the accumulator tiles that cover its
// columns (s[2kk] and s[2kk + 1] for f16/bf16, rounded to T; s[kk] for float32):
// a product's result becomes the next product's operand.
template <typename T> __device__ __forceinline__ void acc_as_a(unsigned* a, const float (*s)[4], int kk) {
    a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}
template <> __device__ __forceinline__ void acc_as_a<float>(unsigned* a, const float (*s)[4], int kk) {
    a[0] = __float_as_uint(s[kk][0]);
    a[1] = __float_as_uint(s[kk][2]);
    a[2] = __float_as_uint(s[kk][1]);
    a[3] = __float_as_uint(s[kk][3]);
}

// The A fragment of inner step kk of 16 rows starting at `row` of a [rows, d]
// view in global memory (row stride `rs`), zero past `rows` or `d`.
template <typename T>
__device__ __forceinline__ void load_a_frag(unsigned* frag, const typename attn_t<T>::E* base, i64 rs, int row,
                                            int rows, int d, int kk) {
    const int K = attn_t<T>::K, HI = attn_t<T>::HI;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int rr = row + g + ((r & 1) ? 8 : 0);
        const int cc = kk * K + 2 * t + ((r & 2) ? HI : 0);
        frag[r] = (rr < rows && cc < d) ? op_reg(base + (i64)rr * rs + cc) : 0u;
    }
}

// A warp's 16 fixed rows of an operand (the queries in the forward; the keys
// and values, or the queries and the output's gradient, in the backward) as the
// products read them: `frag(kk, tmp)` gives the A fragment of inner step kk
// (4 registers, `tmp` where it is loaded into).
// RowsInRegs loads every step's fragment into registers once (DM / K of them);
// RowsInMemory reads each from global memory (through L1) where it is used,
// for kernels whose accumulators leave no room for the fragments (float32's
// backward at head dim 128: 64 registers per operand).
template <typename T, int DM> struct RowsInRegs {
    unsigned f[DM / attn_t<T>::K][4];
    __device__ __forceinline__ RowsInRegs(const typename attn_t<T>::E* base, i64 rs, int row, int rows, int d) {
#pragma unroll
        for (int kk = 0; kk < DM / attn_t<T>::K; ++kk) load_a_frag<T>(f[kk], base, rs, row, rows, d, kk);
    }
    __device__ __forceinline__ const unsigned* frag(int kk, unsigned*) const { return f[kk]; }
};
template <typename T, int DM> struct RowsInMemory {
    const typename attn_t<T>::E* base;
    i64 rs;
    int row, rows, d;
    __device__ __forceinline__ RowsInMemory(const typename attn_t<T>::E* base_, i64 rs_, int row_, int rows_, int d_)
        : base(base_), rs(rs_), row(row_), rows(rows_), d(d_) {}
    __device__ __forceinline__ const unsigned* frag(int kk, unsigned* tmp) const {
        load_a_frag<T>(tmp, base, rs, row, rows, d, kk);
        return tmp;
    }
};

// Whether T's kernels of head dim DM are float32's 128-wide ones, whose
// operand fragments take twice the registers of f16/bf16's: the backward's
// fixed rows are read from memory (their tiles' sizes: attn_steps).
template <typename T, int DM> struct attn_wide32 {
    static const bool value = attn_t<T>::K == 8 && DM > 64;
};
template <bool B, typename X, typename Y> struct attn_pick {
    typedef X type;
};
template <typename X, typename Y> struct attn_pick<false, X, Y> {
    typedef Y type;
};
// The backward kernels' fixed rows: in registers but for float32 at 128.
template <typename T, int DM> struct attn_bwd_rows {
    typedef typename attn_pick<attn_wide32<T, DM>::value, RowsInMemory<T, DM>, RowsInRegs<T, DM> >::type type;
};

// --- shared tiles: copies that run beside the products, and their reads ---------

// The shared tiles of T's kernels at head dim DM. A tile holds rows of an
// operand (keys, values, queries or the output's gradient) as they lie in
// memory, row-major. The products read a tile two ways: along its rows
// (`mma_rows`: the tile is the B operand transposed, as the keys in q kᵀ) and
// down its columns (`mma_cols`: as the values in p v). For f16/bf16 one tile of
// ROW = DM + 8 elements a row serves both: `ldmatrix` reads its 8 x 8 blocks as
// B fragments, `ldmatrix.trans` the same blocks transposed, and the 8 rows of a
// block (272 or 144 bytes apart) fall on 8 different groups of 4 banks. float32
// has no transposing load: a tile read down its columns is a second copy of COL
// = DM + 4 elements a row, on which a warp's column reads (rows 2t and 2t + 1,
// column g) fall on 32 different banks; read along its rows (ROW = DM + 8), a
// lane takes its two elements in one 8-byte load, conflict-free in each half-warp.
template <typename T, int DM> struct attn_tile {
    static const bool HALF = attn_t<T>::K == 16;
    static const int ROW = DM + 8;
    static const int COL = HALF ? DM + 8 : DM + 4;
    // rows start on 16 bytes, as cp.async's and ldmatrix's addresses must
    static_assert(ROW * sizeof(typename attn_t<T>::E) % 16 == 0 && COL * sizeof(typename attn_t<T>::E) % 16 == 0,
                  "a tile's rows must start on 16 bytes");
};

// The rows of the streamed operand per step of each kernel (keys in the forward
// and in dq's kernel, queries in dk and dv's) and the steps whose tiles are in
// shared memory at once in the backward (2: the next step's copies run while
// this one computes; 1: they start after it). The forward always keeps two.
// Sized so that each kernel's tiles stay within the 48 KiB any block may have,
// but float32's forward and dk/dv kernel at head dim 64: their 64 keys and 32
// queries a step take about 70 KiB, in dynamic shared memory (attn_fwd_tiles,
// attn_kv_tiles). Each step repeats the split of a warp's fixed rows into tf32
// parts and the step's bookkeeping, so fewer, longer steps execute fewer
// instructions a key (or query).
template <typename T, int DM> struct attn_steps {
    static const bool HALF = attn_t<T>::K == 16;
    static const int FWD = HALF ? (DM <= 64 ? 64 : 32) : (DM <= 64 ? 64 : 16);
    static const int BWD_KV = HALF ? (DM <= 64 ? 64 : 32) : (DM <= 64 ? 32 : 16);
    static const int BWD_Q = HALF ? (DM <= 64 ? 64 : 32) : 16;
    static const int BWD_STAGES = (HALF || DM <= 64) ? 2 : 1;
};

// The forward's shared tiles, two steps' worth: the keys read along their rows,
// the values down their columns. DYNAMIC where they exceed 48 KiB: then they lie
// in the launch's dynamic shared memory, which backend/cuda/ops/attention.rs
// sizes and opts in to (its tests check its sizes against these).
template <typename T, int DM> struct __align__(16) attn_fwd_tiles {
    typedef typename attn_t<T>::E E;
    typedef attn_tile<T, DM> Tile;
    static const int BC = attn_steps<T, DM>::FWD;
    E k[2][BC * Tile::ROW];
    E v[2][BC * Tile::COL];
    static const bool DYNAMIC;
};
template <typename T, int DM> const bool attn_fwd_tiles<T, DM>::DYNAMIC = sizeof(attn_fwd_tiles<T, DM>) > 48 * 1024;

// dk and dv's shared tiles, S steps' worth: the queries and the output's
// gradient read along their rows and (float32) down their columns, and the
// rows' log-sum-exps and Σ dout · out. DYNAMIC as the forward's.
template <typename T, int DM> struct __align__(16) attn_kv_tiles {
    typedef typename attn_t<T>::E E;
    typedef attn_tile<T, DM> Tile;
    static const int BQ = attn_steps<T, DM>::BWD_KV, S = attn_steps<T, DM>::BWD_STAGES;
    E q[S][BQ * Tile::ROW];
    E qc[S][Tile::HALF ? 8 : BQ * Tile::COL];
    E dout[S][BQ * Tile::ROW];
    E doc[S][Tile::HALF ? 8 : BQ * Tile::COL];
    float lse[S][BQ], d[S][BQ];
    static const bool DYNAMIC;
};
template <typename T, int DM> const bool attn_kv_tiles<T, DM>::DYNAMIC = sizeof(attn_kv_tiles<T, DM>) > 48 * 1024;

// Copies from global to shared memory that run while the block computes
// (`cp.async`, sm_80 and later): `copy<B>` queues B bytes (4 or 16; zeros where
// `in` is false, reading nothing), `commit` closes the group of copies queued
// since the last one, `wait<N>` returns once all but the newest N groups have
// landed; a __syncthreads after it shows them to every thread. The simulator
// fills a copy's destination with ones (NaN in every float type) when it is
// queued and makes the copy at the wait that covers it (or earlier, where its
// queue is full: a copy may land any time before its wait), so that a tile read
// before its wait reads NaN there too. It cannot show a missing barrier between
// one step's reads of a buffer and the copies queued into it later: it runs a
// block's warps in step at every warp-wide exchange (a shuffle, an emulated
// ldmatrix or product), and a step's last reads of a tile are followed by its
// products' exchanges. Those barriers stand at each loop's end.
struct AttnPipe {
#ifdef EMBER_SIMULATOR
    static const int CAP = 32;
    void* dst[CAP];
    const void* src[CAP];
    int bytes[CAP], in[CAP], group[CAP];
    int queued = 0, committed = 0;
    // makes the queued copies of the groups below `upto`, keeping the rest in order
    void land(int upto) {
        int kept = 0;
        for (int i = 0; i < queued; ++i) {
            if (group[i] < upto) {
                if (in[i]) {
                    memcpy(dst[i], src[i], bytes[i]);
                } else {
                    memset(dst[i], 0, bytes[i]);
                }
            } else {
                dst[kept] = dst[i];
                src[kept] = src[i];
                bytes[kept] = bytes[i];
                in[kept] = in[i];
                group[kept] = group[i];
                ++kept;
            }
        }
        queued = kept;
    }
    template <int B> void copy(void* d, const void* s, bool ok) {
        if (queued == CAP) land(committed + 1);
        memset(d, 0xff, B);
        dst[queued] = d;
        src[queued] = s;
        bytes[queued] = B;
        in[queued] = ok;
        group[queued] = committed;
        ++queued;
    }
    void commit() { ++committed; }
    template <int N> void wait() { land(committed - N); }
#else
    template <int B> __device__ __forceinline__ void copy(void* d, const void* s, bool ok) {
#if __CUDA_ARCH__ >= 800
        const unsigned sa = (unsigned)__cvta_generic_to_shared(d);
        if (B == 16) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(s), "r"(ok ? 16 : 0)
                         : "memory");
        } else {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(s), "r"(ok ? 4 : 0)
                         : "memory");
        }
#else
        __trap();
#endif
    }
    __device__ __forceinline__ void commit() {
#if __CUDA_ARCH__ >= 800
        asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
    }
    template <int N> __device__ __forceinline__ void wait() {
#if __CUDA_ARCH__ >= 800
        asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
    }
#endif
};

// Queues the copies of rows [r0, r0 + R) of a [rows, d] view in global memory
// (row stride `rs`) into the shared tile `dst` (ST elements a row), 16 bytes
// each, consecutive threads taking consecutive pieces of a row; zeros past
// `rows` or `d`, so that products over a tile's DM columns add nothing there.
// A thread keeps its piece of a row (ATT_THREADS is a multiple of the pieces a
// row) and steps down the rows ATT_THREADS / C at a time: its column, first
// offset and column test are worked out once; each copy adds a stride and
// tests its row.
template <int DM, int R, int ST, typename E>
__device__ __forceinline__ void tile_copy(AttnPipe& pipe, E* dst, const E* base, i64 rs, int r0, int rows, int d) {
    const int V = 16 / sizeof(E), C = DM / V, RS = ATT_THREADS / C;
    static_assert(ATT_THREADS % C == 0 && R % RS == 0, "a tile's copies must share the threads out evenly");
    const int r = threadIdx.x / C, c = (threadIdx.x % C) * V;
    const bool cin = c < d;
    i64 off = (i64)(r0 + r) * rs + c;
#pragma unroll
    for (int i = 0; i < R / RS; ++i) {
        const bool in = cin && r0 + r + i * RS < rows;
        pipe.copy<16>(dst + (r + i * RS) * ST + c, in ? base + off : base, in);
        off += (i64)RS * rs;
    }
}

// r[i], for the four 8 x 8 blocks i of 16-bit elements whose rows lanes 8i ..
// 8i + 7 point at (`p`: 16 bytes, 16-byte aligned, in shared memory): the
// elements (g, 2t) and (g, 2t + 1) of block i (`ldmatrix`), or with TRANS those
// of the block transposed, (2t, g) and (2t + 1, g) (`ldmatrix.trans`); the first
// in the low half.
template <bool TRANS> __device__ __forceinline__ void ldsm4(unsigned* r, const u16* p) {
#ifdef EMBER_SIMULATOR
    // every lane's row pointer, in one exchange
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const void* lanes[32];
    __ember_sim_warp_all(&p, sizeof p, lanes);
    const auto row = [&](int i) { return lanes[i] ? *(const u16* const*)lanes[i] : p; };
    for (int i = 0; i < 4; ++i) {
        if (TRANS) {
            const u16* lo = row(i * 8 + 2 * t);
            const u16* hi = row(i * 8 + 2 * t + 1);
            r[i] = (unsigned)lo[g] | ((unsigned)hi[g] << 16);
        } else {
            const u16* rw = row(i * 8 + g);
            r[i] = (unsigned)rw[2 * t] | ((unsigned)rw[2 * t + 1] << 16);
        }
    }
#elif __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    }
#else
    __trap();
#endif
}

struct __align__(8) attn_f2 {
    float x, y;
};

// c[n] += a · tᵀ for the accumulator tiles n < NT (16 x 8 each): a warp's 16
// rows (`a`, a Rows type below) against rows n·8 .. n·8 + 7 of the shared tile
// `t` (attn_tile's ROW elements a row), over the first `d` columns. f16/bf16
// take the B fragments of two tiles in one `ldmatrix` (blocks: tile n's columns
// kk·16 .. + 7 and + 8 .. + 15, then tile n + 1's).
template <typename T, int DM, int NT, typename Rows>
__device__ __forceinline__ void mma_rows(float (*c)[4], const Rows& a, const typename attn_t<T>::E* t, int d) {
    const int K = attn_t<T>::K, ST = attn_tile<T, DM>::ROW;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    // float32: this lane's element of the tile's first step, the others a
    // constant offset from it (folded into the loads' addresses)
    const typename attn_t<T>::E* tq = t + g * ST + 2 * q;
#pragma unroll
    for (int kk = 0; kk < DM / K; ++kk) {
        if (kk * K >= d) break;
        unsigned tmp[4];
        const mma_a<T> af(a.frag(kk, tmp));
        if constexpr (K == 16) {
            static_assert(NT % 2 == 0, "f16/bf16 tiles are read two at a time");
            const u16* p = t + ((lane >> 4) * 8 + (lane & 7)) * ST + kk * 16 + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                unsigned b[4];
                ldsm4<false>(b, p + n * 8 * ST);
                mma<T>(c[n], af, b);
                mma<T>(c[n + 1], af, b + 2);
            }
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const attn_f2 v = *(const attn_f2*)(tq + n * 8 * ST + kk * 8);
                const unsigned b[2] = {__float_as_uint(v.x), __float_as_uint(v.y)};
                mma<T>(c[n], af, b);
            }
        }
    }
}

// acc[n] += a · t[kk·K .., n·8 ..] for every accumulator tile n below `d`: `a`
// the A fragment of inner step kk, whose inner dim runs down the rows of the
// shared tile `t` (f16/bf16: ROW elements a row, two tiles' B fragments in one
// `ldmatrix.trans`, blocks: rows kk·16 .. + 7 and + 8 .. + 15 of columns n·8 ..,
// then of n·8 + 8 ..; float32: the column copy, COL a row).
template <typename T, int DM>
__device__ __forceinline__ void mma_cols(float (*acc)[4], const unsigned* a_, const typename attn_t<T>::E* t, int kk,
                                         int d) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const mma_a<T> a(a_);
    if constexpr (attn_t<T>::K == 16) {
        const int ST = attn_tile<T, DM>::ROW;
        const u16* p = t + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ST + (lane >> 4) * 8;
#pragma unroll
        for (int n = 0; n < DM / 8; n += 2) {
            if (n * 8 >= d) break;
            unsigned b[4];
            ldsm4<true>(b, p + n * 8);
            mma<T>(acc[n], a, b);
            mma<T>(acc[n + 1], a, b + 2);
        }
    } else {
        const int ST = attn_tile<T, DM>::COL;
        const float* p = t + (2 * q * ST + g) + kk * 8 * ST;
#pragma unroll
        for (int n = 0; n < DM / 8; ++n) {
            if (n * 8 >= d) break;
            const unsigned b[2] = {__float_as_uint(p[n * 8]), __float_as_uint(p[ST + n * 8])};
            mma<T>(acc[n], a, b);
        }
    }
}

// The backward's two products over G accumulator tiles: c1 = a1 · t1ᵀ and
// c2 = a2 · t2ᵀ from zero (the scores, or their transposes, and dout vᵀ), each
// tile an independent chain of products (mma_rows).
template <typename T, int DM, int G, typename Rows1, typename Rows2>
__device__ __forceinline__ void attn_product_pair(float (*c1)[4], const Rows1& a1, const typename attn_t<T>::E* t1,
                                                  float (*c2)[4], const Rows2& a2, const typename attn_t<T>::E* t2,
                                                  int d) {
#pragma unroll
    for (int n = 0; n < G; ++n) {
        c1[n][0] = c1[n][1] = c1[n][2] = c1[n][3] = 0.f;
        c2[n][0] = c2[n][1] = c2[n][2] = c2[n][3] = 0.f;
    }
    mma_rows<T, DM, G>(c1, a1, t1, d);
    mma_rows<T, DM, G>(c2, a2, t2, d);
}

// The bias of (qi, kj) in log2 units (0 in the kernels without one), `bias` at its pair's
// (batch, head) start; qi and kj within the sequences. A finite bias stays
// finite (a dtype's lowest value, a common mask, would overflow to -inf when
// scaled, and mask more than it does elsewhere); -inf stays -inf.
template <typename T, bool MASKED>
__device__ __forceinline__ float attn_bias(const AttnArgs& a, const T* bias, int qi, int kj) {
    if (!MASKED) return 0.f;
    const float b = widen(bias[qi * a.bias_st[2] + kj * a.bias_st[3]]);
    return b == __int_as_float(0xff800000) ? b : fmaxf(b * ATT_LOG2E, -3.402823466e38f);
}

// A weight's exponent in log2 units: the score `s` scaled (c2: the scale times
// log2 e), plus the bias in the kernels with one, less `sub` (its row's
// log-sum-exp in log2 units). Without a bias, one multiply-add: adding a bias of
// 0 would take an instruction of its own (x + 0 is not x where x is -0).
template <typename T, bool MASKED>
__device__ __forceinline__ float attn_exponent(const AttnArgs& a, const T* bias, float s, float c2, float sub, int qi,
                                               int kj) {
    if (MASKED) return s * c2 + attn_bias<T, MASKED>(a, bias, qi, kj) - sub;
    return s * c2 - sub;
}

// A row's log-sum-exp in log2 units as the backward subtracts it: +inf for a row
// that saw no key, so that its weights come out as exp2(-inf) = 0.
__device__ __forceinline__ float attn_lse2(float lse) {
    return lse == __int_as_float(0xff800000) ? __int_as_float(0x7f800000) : lse * ATT_LOG2E;
}

// Where the (batch, head) pair `b`, `h` starts in q, k, v and (with MASKED) the
// bias; null for no bias.
template <typename T> struct AttnPair {
    const typename attn_t<T>::E *q, *k, *v;
    const T* bias;
};
template <typename T, bool MASKED>
__device__ __forceinline__ AttnPair<T> attn_pair(const T* q, const T* k, const T* v, const T* bias,
                                                 const AttnArgs& a, int b, int h) {
    typedef typename attn_t<T>::E E;
    return {(const E*)q + a.q_off + b * a.qs[0] + h * a.qs[1], (const E*)k + a.k_off + b * a.ks[0] + h * a.ks[1],
            (const E*)v + a.v_off + b * a.vs[0] + h * a.vs[1],
            MASKED ? bias + a.bias_off + b * a.bias_st[0] + h * a.bias_st[1] : nullptr};
}

// The block of queries this block takes (the grid's y): under the causal mask a
// later block sees more keys, so the blocks run from the last one down, the
// longest first, and the short ones fill the grid's last wave (in the grid's
// order the longest would run last, the multiprocessors idle around them).
__device__ __forceinline__ int attn_query_block(const AttnArgs& a) {
    return a.causal ? (int)(gridDim.y - 1 - blockIdx.y) : (int)blockIdx.y;
}

// Whether query `qi` may see key `kj`.
__device__ __forceinline__ bool attn_visible(const AttnArgs& a, int qi, int kj) {
    return qi < a.l && kj < a.s && !(a.causal && kj > qi);
}

// Whether every query of [q0, q0 + nq) may see every key of [k0, k0 + nk): then
// a tile's scores need no test each (attn_visible), and most tiles of a long
// causal sequence are such (all but those on the diagonal and at the ends). The
// kernels call the loop over a tile's scores with `all` a literal true or false,
// so that the inlined copies keep the test only where it is needed.
__device__ __forceinline__ bool attn_all_visible(const AttnArgs& a, int q0, int nq, int k0, int nk) {
    return q0 + nq <= a.l && k0 + nk <= a.s && !(a.causal && k0 + nk - 1 > q0);
}

template <typename T, int DM, bool MASKED>
__device__ void attn_fwd_impl(const T* q_, const T* k_, const T* v_, const T* bias_, T* out_, float* lse, AttnArgs a) {
    typedef typename attn_t<T>::E E;
    typedef attn_tile<T, DM> Tile;
    const int K = attn_t<T>::K, BR = 64, BC = attn_steps<T, DM>::FWD;
    // the keys read along their rows, the values down their columns, two steps'
    // worth (attn_fwd_tiles; where they fit in 48 KiB, arrays of their own, as
    // the compiler places them best)
    E(*sk)[BC * Tile::ROW];
    E(*sv)[BC * Tile::COL];
    if constexpr (attn_fwd_tiles<T, DM>::DYNAMIC) {
        extern __shared__ __align__(16) unsigned char attn_shared[];
        attn_fwd_tiles<T, DM>& t = *reinterpret_cast<attn_fwd_tiles<T, DM>*>(attn_shared);
        sk = t.k, sv = t.v;
    } else {
        __shared__ __align__(16) E k_s[2][BC * Tile::ROW];
        __shared__ __align__(16) E v_s[2][BC * Tile::COL];
        sk = k_s, sv = v_s;
    }
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = attn_query_block(a) * BR, row0 = q0 + warp * 16;
    // (named, not a structured binding: the tile copies' lambda captures them)
    const AttnPair<T> pair = attn_pair<T, MASKED>(q_, k_, v_, bias_, a, b, h);
    const E *q = pair.q, *k = pair.k, *v = pair.v;
    const T* bias = pair.bias;

    const RowsInRegs<T, DM> qa(q, a.qs[2], row0, a.l, a.d);
    float o[DM / 8][4];
#pragma unroll
    for (int n = 0; n < DM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    const float neg_inf = __int_as_float(0xff800000);
    float m[2] = {neg_inf, neg_inf}, sum[2] = {0.f, 0.f};
    const float c2 = a.scale * ATT_LOG2E;

    const u64 pair_hash = attn_mix(a.seed ^ (u64)bh);
    const int kend = a.causal ? min(a.s, q0 + BR) : a.s, steps = (kend + BC - 1) / BC;
    AttnPipe pipe;
    // queues step `st`'s keys and values into buffer st % 2
    auto fetch = [&](int st) {
        tile_copy<DM, BC, Tile::ROW>(pipe, sk[st & 1], k, a.ks[2], st * BC, a.s, a.d);
        tile_copy<DM, BC, Tile::COL>(pipe, sv[st & 1], v, a.vs[2], st * BC, a.s, a.d);
        pipe.commit();
    };
    if (steps > 0) fetch(0);
    for (int st = 0; st < steps; ++st) {
        const int j0 = st * BC;
        const E *kt = sk[st & 1], *vt = sv[st & 1];
        // the next step's copies run while this one computes (into the buffer
        // every warp finished reading at the end of the last step)
        if (st + 1 < steps) {
            fetch(st + 1);
            pipe.wait<1>();
        } else {
            pipe.wait<0>();
        }
        __syncthreads();
        // scores of this warp's 16 rows against the step's keys
        float s[BC / 8][4];
#pragma unroll
        for (int n = 0; n < BC / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        mma_rows<T, DM, BC / 8>(s, qa, kt, a.d);
        // scale (in log2 units) and mask, each row's new max, weights
        float mx[2] = {neg_inf, neg_inf};
        auto mask = [&](const bool all) {
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int qi = row0 + g + ((e & 2) ? 8 : 0), kj = j0 + n * 8 + 2 * t + (e & 1);
                    const bool seen = all || attn_visible(a, qi, kj);
                    s[n][e] = seen ? s[n][e] * c2 + attn_bias<T, MASKED>(a, bias, qi, kj) : neg_inf;
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
                }
            }
        };
        if (attn_all_visible(a, row0, 16, j0, BC)) {
            mask(true);
        } else {
            mask(false);
        }
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mnew = fmaxf(m[r], mx[r]);
            base[r] = mnew == neg_inf ? 0.f : mnew;  // a row that sees no key yet
            alpha[r] = attn_exp2(m[r] - base[r]);
            m[r] = mnew;
            sum[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[n][e] = attn_exp2(s[n][e] - base[e >> 1]);
                sum[e >> 1] += s[n][e];
            }
        }
        // dropout after the softmax's sum: out = Σ keep · w · v / Σ w (one test
        // a step, not one a weight)
        if (a.drop_threshold) {
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[n][e] *= attn_keep(a, pair_hash, row0 + g + ((e & 2) ? 8 : 0), j0 + n * 8 + 2 * t + (e & 1));
            }
        }
#pragma unroll
        for (int n = 0; n < DM / 8; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        // out += weights · v, the weights as A fragments straight from s
#pragma unroll
        for (int kk = 0; kk < BC / K; ++kk) {
            unsigned pa[4];
            acc_as_a<T>(pa, s, kk);
            mma_cols<T, DM>(o, pa, vt, kk, a.d);
        }
        __syncthreads();
    }
    // each row's sum over its four lanes, then out = o / sum
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
    E* out = (E*)out_ + b * a.os[0] + h * a.os[1];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int qi = row0 + g + 8 * r;
        if (qi >= a.l) continue;
        // a row that saw no key: zeros; NaN scores stay NaN
        const float inv = sum[r] == 0.f ? 0.f : 1.f / sum[r];
#pragma unroll
        for (int n = 0; n < DM / 8; ++n) {
            const int c = n * 8 + 2 * t;
            if (c < a.d) store2<T>(out + qi * a.os[2] + c, o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        }
        if (t == 0) lse[(i64)bh * a.l + qi] = sum[r] == 0.f ? neg_inf : (m[r] + log2f(sum[r])) / ATT_LOG2E;
    }
}

// D[row] = Σ_c dout[row, c] · out[row, c] over the `rows` rows of all pairs, a
// warp per row.
template <typename T>
__device__ void attn_dot_impl(const T* dout, const AttnArgs a, const T* out, float* dsum, i64 rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (i64 r = (i64)blockIdx.x * (ATT_THREADS / 32) + warp; r < rows; r += (i64)gridDim.x * (ATT_THREADS / 32)) {
        // dout is a [batch, heads, L, d] view (strides in a.qs), out where a.os puts it
        const i64 bh = r / a.l, qi = r % a.l, b = bh / a.heads, h = bh % a.heads;
        const T* g = dout + a.q_off + b * a.qs[0] + h * a.qs[1] + qi * a.qs[2];
        const T* o = out + b * a.os[0] + h * a.os[1] + qi * a.os[2];
        float acc = 0.f;
        for (int c = lane; c < a.d; c += 32) acc += widen(g[c]) * widen(o[c]);
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) dsum[r] = acc;
    }
}

// The keys' and values' gradients of a block of 64 keys (a warp per 16), over
// the query blocks that see them: with the roles of rows and columns swapped,
// sᵀ = k qᵀ, pᵀ = exp(sᵀ · scale - lse), dv += pᵀ dout, dpᵀ = v doutᵀ,
// dsᵀ = pᵀ (dpᵀ - D), dk += dsᵀ q · scale.
template <typename T, int DM, bool MASKED>
__device__ void attn_bwd_kv_impl(const T* q_, const T* k_, const T* v_, const T* bias_, const T* dout_, const float* lse,
                                 const float* dsum, T* dk_, T* dv_, AttnArgs a, AttnArgs ga) {
    typedef typename attn_t<T>::E E;
    typedef attn_tile<T, DM> Tile;
    typedef attn_kv_tiles<T, DM> Tiles;
    const int K = attn_t<T>::K, BK = 64, BQ = Tiles::BQ, S = Tiles::S;
    const bool LSE2_ONCE = BQ >= 64;
    // the tiles (attn_kv_tiles; where they fit in 48 KiB, arrays of their own, as
    // the compiler places them best), the log-sum-exps in log2 units once
    // converted (LSE2_ONCE)
    E(*sq)[BQ * Tile::ROW];
    E(*sqc)[Tile::HALF ? 8 : BQ * Tile::COL];
    E(*sdo)[BQ * Tile::ROW];
    E(*sdoc)[Tile::HALF ? 8 : BQ * Tile::COL];
    float(*slse)[BQ];
    float(*sd)[BQ];
    if constexpr (Tiles::DYNAMIC) {
        extern __shared__ __align__(16) unsigned char attn_shared[];
        Tiles& t = *reinterpret_cast<Tiles*>(attn_shared);
        sq = t.q, sqc = t.qc, sdo = t.dout, sdoc = t.doc, slse = t.lse, sd = t.d;
    } else {
        __shared__ __align__(16) E q_s[S][BQ * Tile::ROW];
        __shared__ __align__(16) E qc_s[S][Tile::HALF ? 8 : BQ * Tile::COL];
        __shared__ __align__(16) E do_s[S][BQ * Tile::ROW];
        __shared__ __align__(16) E doc_s[S][Tile::HALF ? 8 : BQ * Tile::COL];
        __shared__ __align__(16) float lse_s[S][BQ], d_s[S][BQ];
        sq = q_s, sqc = qc_s, sdo = do_s, sdoc = doc_s, slse = lse_s, sd = d_s;
    }
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int k0 = blockIdx.y * BK, key0 = k0 + warp * 16;
    // (named, not a structured binding: the tile copies' lambda captures them)
    const AttnPair<T> pair = attn_pair<T, MASKED>(q_, k_, v_, bias_, a, b, h);
    const E *q = pair.q, *k = pair.k, *v = pair.v;
    const T* bias = pair.bias;
    const E* dout = (const E*)dout_ + ga.q_off + b * ga.qs[0] + h * ga.qs[1];
    const float* lse_bh = lse + (i64)bh * a.l;
    const float* d_bh = dsum + (i64)bh * a.l;

    typedef typename attn_bwd_rows<T, DM>::type Rows;
    const Rows ka(k, a.ks[2], key0, a.s, a.d), va(v, a.vs[2], key0, a.s, a.d);
    float dk[DM / 8][4], dv[DM / 8][4];
#pragma unroll
    for (int n = 0; n < DM / 8; ++n)
        for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
    const float c2 = a.scale * ATT_LOG2E;

    const u64 pair_hash = attn_mix(a.seed ^ (u64)bh);
    // with the causal mask, queries before the block's first key see none of it
    const int qstart = a.causal ? (k0 / BQ) * BQ : 0, steps = a.l > qstart ? (a.l - qstart + BQ - 1) / BQ : 0;
    AttnPipe pipe;
    // queues step `st`'s queries, output gradients and row statistics into buffer st % S
    auto fetch = [&](int st) {
        const int i0 = qstart + st * BQ, buf = st % S;
        tile_copy<DM, BQ, Tile::ROW>(pipe, sq[buf], q, a.qs[2], i0, a.l, a.d);
        tile_copy<DM, BQ, Tile::ROW>(pipe, sdo[buf], dout, ga.qs[2], i0, a.l, a.d);
        if (!Tile::HALF) {
            tile_copy<DM, BQ, Tile::COL>(pipe, sqc[buf], q, a.qs[2], i0, a.l, a.d);
            tile_copy<DM, BQ, Tile::COL>(pipe, sdoc[buf], dout, ga.qs[2], i0, a.l, a.d);
        }
        for (int i = threadIdx.x; i < BQ; i += ATT_THREADS) {
            const bool in = i0 + i < a.l;
            pipe.copy<4>(&slse[buf][i], in ? lse_bh + i0 + i : lse_bh, in);
            pipe.copy<4>(&sd[buf][i], in ? d_bh + i0 + i : d_bh, in);
        }
        pipe.commit();
    };
    if (steps > 0) fetch(0);
    for (int st = 0; st < steps; ++st) {
        const int i0 = qstart + st * BQ, buf = st % S;
        const E *qr = sq[buf], *dor = sdo[buf];
        const E *qc_t = Tile::HALF ? sq[buf] : sqc[buf], *doc_t = Tile::HALF ? sdo[buf] : sdoc[buf];
        // with two buffers the next step's copies run while this one computes
        if (S == 2 && st + 1 < steps) {
            fetch(st + 1);
            pipe.wait<1>();
        } else {
            pipe.wait<0>();
        }
        // with 64 queries a step, each thread puts the log-sum-exps it copied
        // into the form the weights read (log2 units; +inf for a row that saw no
        // key) once a row; with fewer, the pass costs more than it saves, and
        // the weights convert them as they read them
        if (LSE2_ONCE) {
            for (int i = threadIdx.x; i < BQ; i += ATT_THREADS) slse[buf][i] = attn_lse2(slse[buf][i]);
        }
        __syncthreads();
        // sᵀ (this warp's 16 keys against the step's queries) and dpᵀ = v doutᵀ,
        // G accumulator tiles of each at a time (as many independent chains of
        // products), then pᵀ and dsᵀ from them: all tiles at once, or two at a
        // time in the f16/bf16 masked kernels, whose bias reads hold registers
        // too (float32's, with 4 tiles at most, hold them all)
        const int NT = BQ / 8, G = MASKED && Tile::HALF ? 2 : NT;
        float p[NT][4], dp[NT][4];
        auto products = [&](const int n0) {
            const int at = n0 * 8 * Tile::ROW;
            attn_product_pair<T, DM, G>(p + n0, ka, qr + at, dp + n0, va, dor + at, a.d);
        };
        // the weights pᵀ, and without dropout dsᵀ = pᵀ (dpᵀ - D); with dropout
        // dsᵀ = pᵀ (dpᵀ · keep - D) and the kept weights below, outside the
        // loop that runs on every step
        const bool drop = a.drop_threshold != 0;
        auto weights = [&](const bool all) {
#pragma unroll
            for (int n0 = 0; n0 < NT; n0 += G) {
                if (G < NT) products(n0);
#pragma unroll
                for (int n = n0; n < n0 + G; ++n) {
                    // the statistics of this lane's two queries (columns 2t and
                    // 2t + 1 of tile n), read once for both of its keys
                    const attn_f2 ls = *(const attn_f2*)&slse[buf][n * 8 + 2 * t];
                    const attn_f2 ds = *(const attn_f2*)&sd[buf][n * 8 + 2 * t];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int kj = key0 + g + ((e & 2) ? 8 : 0), qc = n * 8 + 2 * t + (e & 1), qi = i0 + qc;
                        const bool seen = all || attn_visible(a, qi, kj);
                        const float l = (e & 1) ? ls.y : ls.x;
                        const float w = seen ? attn_exp2(attn_exponent<T, MASKED>(a, bias, p[n][e], c2,
                                                                                 LSE2_ONCE ? l : attn_lse2(l), qi, kj))
                                             : 0.f;
                        p[n][e] = w;
                        if (!drop) dp[n][e] = w * (dp[n][e] - ((e & 1) ? ds.y : ds.x));
                    }
                }
            }
        };
        if (G == NT) products(0);
        // (one copy in the masked kernels at head dim 128, where the bias's
        // reads already hold the registers: f16/bf16's spilled with two)
        if (!(MASKED && DM > 64) && attn_all_visible(a, i0, BQ, key0, 16)) {
            weights(true);
        } else {
            weights(false);
        }
        if (drop) {
#pragma unroll
            for (int n = 0; n < BQ / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int kj = key0 + g + ((e & 2) ? 8 : 0), qc = n * 8 + 2 * t + (e & 1);
                    const float z = attn_keep(a, pair_hash, i0 + qc, kj);
                    dp[n][e] = p[n][e] * (dp[n][e] * z - sd[buf][qc]);  // dsᵀ
                    p[n][e] *= z;                                      // the kept weights, into dv
                }
            }
        }
        // dv += pᵀ dout and dk += dsᵀ q, both as A fragments from the registers
#pragma unroll
        for (int kq = 0; kq < BQ / K; ++kq) {
            unsigned pa[4], da[4];
            acc_as_a<T>(pa, p, kq);
            acc_as_a<T>(da, dp, kq);
            mma_cols<T, DM>(dv, pa, doc_t, kq, a.d);
            mma_cols<T, DM>(dk, da, qc_t, kq, a.d);
        }
        // every warp is done with this buffer before copies land in it again
        __syncthreads();
        if (S == 1 && st + 1 < steps) fetch(st + 1);
    }
    E* dk_out = (E*)dk_ + b * a.dkvs[0] + h * a.dkvs[1];
    E* dv_out = (E*)dv_ + b * a.dkvs[0] + h * a.dkvs[1];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int kj = key0 + g + 8 * r;
        if (kj >= a.s) continue;
#pragma unroll
        for (int n = 0; n < DM / 8; ++n) {
            const int c = n * 8 + 2 * t;
            if (c >= a.d) continue;
            store2<T>(dk_out + kj * a.dkvs[2] + c, dk[n][2 * r] * a.scale, dk[n][2 * r + 1] * a.scale);
            store2<T>(dv_out + kj * a.dkvs[2] + c, dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

// The queries' gradient of a block of 64 queries (a warp per 16), over the key
// blocks they see: s = q kᵀ, p = exp(s · scale - lse), dp = dout vᵀ,
// ds = p (dp - D), dq += ds k · scale.
template <typename T, int DM, bool MASKED>
__device__ void attn_bwd_q_impl(const T* q_, const T* k_, const T* v_, const T* bias_, const T* dout_, const float* lse,
                                const float* dsum, T* dq_, AttnArgs a, AttnArgs ga) {
    typedef typename attn_t<T>::E E;
    typedef attn_tile<T, DM> Tile;
    const int K = attn_t<T>::K, BR = 64, BK = attn_steps<T, DM>::BWD_Q, S = attn_steps<T, DM>::BWD_STAGES;
    // the keys read along their rows and down their columns (float32: the
    // column copy), the values along their rows, for S steps
    __shared__ __align__(16) E sk[S][BK * Tile::ROW];
    __shared__ __align__(16) E skc[S][Tile::HALF ? 8 : BK * Tile::COL];
    __shared__ __align__(16) E sv[S][BK * Tile::ROW];
    static_assert(sizeof(sk) + sizeof(skc) + sizeof(sv) <= 48 * 1024, "the queries' backward's tiles exceed 48 KiB");
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = attn_query_block(a) * BR, row0 = q0 + warp * 16;
    // (named, not a structured binding: the tile copies' lambda captures them)
    const AttnPair<T> pair = attn_pair<T, MASKED>(q_, k_, v_, bias_, a, b, h);
    const E *q = pair.q, *k = pair.k, *v = pair.v;
    const T* bias = pair.bias;
    const E* dout = (const E*)dout_ + ga.q_off + b * ga.qs[0] + h * ga.qs[1];

    typedef typename attn_bwd_rows<T, DM>::type Rows;
    const Rows qa(q, a.qs[2], row0, a.l, a.d), ga_(dout, ga.qs[2], row0, a.l, a.d);
    float lrow[2], drow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int qi = row0 + g + 8 * r;
        lrow[r] = qi < a.l ? attn_lse2(lse[(i64)bh * a.l + qi]) : 0.f;
        drow[r] = qi < a.l ? dsum[(i64)bh * a.l + qi] : 0.f;
    }
    float dq[DM / 8][4];
#pragma unroll
    for (int n = 0; n < DM / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
    const float c2 = a.scale * ATT_LOG2E;

    const u64 pair_hash = attn_mix(a.seed ^ (u64)bh);
    const int kend = a.causal ? min(a.s, q0 + BR) : a.s, steps = (kend + BK - 1) / BK;
    AttnPipe pipe;
    // queues step `st`'s keys and values into buffer st % S
    auto fetch = [&](int st) {
        const int j0 = st * BK, buf = st % S;
        tile_copy<DM, BK, Tile::ROW>(pipe, sk[buf], k, a.ks[2], j0, a.s, a.d);
        if (!Tile::HALF) tile_copy<DM, BK, Tile::COL>(pipe, skc[buf], k, a.ks[2], j0, a.s, a.d);
        tile_copy<DM, BK, Tile::ROW>(pipe, sv[buf], v, a.vs[2], j0, a.s, a.d);
        pipe.commit();
    };
    if (steps > 0) fetch(0);
    for (int st = 0; st < steps; ++st) {
        const int j0 = st * BK, buf = st % S;
        const E *kr = sk[buf], *vr = sv[buf], *kc = Tile::HALF ? sk[buf] : skc[buf];
        // with two buffers the next step's copies run while this one computes
        if (S == 2 && st + 1 < steps) {
            fetch(st + 1);
            pipe.wait<1>();
        } else {
            pipe.wait<0>();
        }
        __syncthreads();
        // s = q kᵀ and dp = dout vᵀ, G accumulator tiles of each at a time (all,
        // or two at a time in the masked kernels, as in dk and dv's), then ds
        // (without dropout in the loop over the scores; with it below, outside
        // the loop that runs on every step)
        const int NT = BK / 8, G = MASKED ? 2 : NT;
        float p[NT][4], dp[NT][4];
        auto products = [&](const int n0) {
            const int at = n0 * 8 * Tile::ROW;
            attn_product_pair<T, DM, G>(p + n0, qa, kr + at, dp + n0, ga_, vr + at, a.d);
        };
        const bool drop = a.drop_threshold != 0;
        auto grads = [&](const bool all) {
#pragma unroll
            for (int n0 = 0; n0 < NT; n0 += G) {
                if (G < NT) products(n0);
#pragma unroll
                for (int n = n0; n < n0 + G; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int qi = row0 + g + ((e & 2) ? 8 : 0), kj = j0 + n * 8 + 2 * t + (e & 1);
                        const bool seen = all || attn_visible(a, qi, kj);
                        const float w =
                            seen ? attn_exp2(attn_exponent<T, MASKED>(a, bias, p[n][e], c2, lrow[e >> 1], qi, kj))
                                 : 0.f;
                        p[n][e] = w;
                        if (!drop) dp[n][e] = w * (dp[n][e] - drow[e >> 1]);  // ds
                    }
                }
            }
        };
        if (G == NT) products(0);
        if (attn_all_visible(a, row0, 16, j0, BK)) {
            grads(true);
        } else {
            grads(false);
        }
        if (drop) {
#pragma unroll
            for (int n = 0; n < BK / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int qi = row0 + g + ((e & 2) ? 8 : 0), kj = j0 + n * 8 + 2 * t + (e & 1);
                    dp[n][e] = p[n][e] * (dp[n][e] * attn_keep(a, pair_hash, qi, kj) - drow[e >> 1]);  // ds
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < BK / K; ++kk) {
            unsigned da[4];
            acc_as_a<T>(da, dp, kk);
            mma_cols<T, DM>(dq, da, kc, kk, a.d);
        }
        // every warp is done with this buffer before copies land in it again
        __syncthreads();
        if (S == 1 && st + 1 < steps) fetch(st + 1);
    }
    E* dq_out = (E*)dq_ + b * a.dqs[0] + h * a.dqs[1];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int qi = row0 + g + 8 * r;
        if (qi >= a.l) continue;
#pragma unroll
        for (int n = 0; n < DM / 8; ++n) {
            const int c = n * 8 + 2 * t;
            if (c < a.d)
                store2<T>(dq_out + qi * a.dqs[2] + c, dq[n][2 * r] * a.scale, dq[n][2 * r + 1] * a.scale);
        }
    }
}

// The kernels of dtype T (suffix S) and head dim D; `masked` (M = true) the ones
// that add the bias. FB and QB: the blocks per multiprocessor the forward's and
// dq's kernels are held to (registers at most 64 Ki / (128 · blocks)), which the
// compiler would otherwise trade for registers; dk and dv's take 2 (up to 255).
#define ATTENTION_DM_M(T, S, D, NAME, M, FB, QB)                                                      \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, FB)                                              \
        attn_fwd##NAME##_##S##_d##D(const T* q, const T* k, const T* v, const T* bias, T* out, float* lse,     \
                                    AttnArgs a) {                                                              \
        attn_fwd_impl<T, D, M>(q, k, v, bias, out, lse, a);                                                    \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, 2)                                               \
        attn_bwd_kv##NAME##_##S##_d##D(const T* q, const T* k, const T* v, const T* bias, const T* dout,       \
                                       const float* lse, const float* dsum, T* dk, T* dv, AttnArgs a,          \
                                       AttnArgs ga) {                                                          \
        attn_bwd_kv_impl<T, D, M>(q, k, v, bias, dout, lse, dsum, dk, dv, a, ga);                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, QB)                                              \
        attn_bwd_q##NAME##_##S##_d##D(const T* q, const T* k, const T* v, const T* bias, const T* dout,        \
                                      const float* lse, const float* dsum, T* dq, AttnArgs a, AttnArgs ga) {   \
        attn_bwd_q_impl<T, D, M>(q, k, v, bias, dout, lse, dsum, dq, a, ga);                                   \
    }

#define ATTENTION_DM(T, S, D, FB, QB) \
    ATTENTION_DM_M(T, S, D, , false, FB, QB) ATTENTION_DM_M(T, S, D, _masked, true, FB, QB)

#define ATTENTION_DOT(T, S)                                                                                   \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                  \
        attn_dot_##S(const T* dout, AttnArgs ga, const T* out, float* dsum, i64 rows) {                       \
        attn_dot_impl<T>(dout, ga, out, dsum, rows);                                                           \
    }

IF_f16(ATTENTION_DM(f16, f16, 64, 3, 3) ATTENTION_DM(f16, f16, 128, 3, 2) ATTENTION_DOT(f16, f16))
IF_bf16(ATTENTION_DM(bf16, bf16, 64, 3, 3) ATTENTION_DM(bf16, bf16, 128, 3, 2) ATTENTION_DOT(bf16, bf16))
IF_f32(ATTENTION_DM(float, f32, 64, 3, 3) ATTENTION_DM(float, f32, 128, 2, 3) ATTENTION_DOT(float, f32))
