// ember's CUDA simulator: what CUDA C needs to compile as C++ for the CPU, and a
// scheduler that runs a launch's blocks one after another.
//
// Placed before every kernel source the simulator compiles (with the host's C++
// compiler, at run time, like NVRTC on a GPU). Each block's threads run as fibers on
// the calling thread: a kernel that never waits (no __syncthreads, no warp
// shuffle) runs its threads as plain calls; otherwise every thread gets a stack and
// yields at each barrier, and a warp's shuffles exchange values through slots.
// The simulator checks logic (indexing, layouts, reductions, launch parameters),
// not timing, memory coherence or the hardware's floating-point details.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#define EMBER_SIMULATOR 1
#ifndef __global__
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __shared__ static
#define __constant__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace ember_sim {

// Mirrors `SimLaunch` in sim/mod.rs.
struct Launch {
    unsigned int grid[3];
    unsigned int block[3];
    unsigned int shared_mem;
    int fibers;  // 1 when the kernel may wait at a barrier
};
static_assert(sizeof(Launch) == 32, "Launch mirrors SimLaunch");

enum State { RUNNABLE, AT_BLOCK, AT_WARP, DONE };

// The most a lane publishes at one warp-wide exchange, in 8-byte words.
static const int WARP_SLOT_WORDS = 4;

struct Fiber {
    void* sp;  // saved stack pointer while switched out
    char* stack;
    uint3 idx;
    int state;
    // what the fiber publishes at a warp-wide exchange (a shuffle's value, an
    // emulated matrix instruction's fragments), in two buffers used in turn so
    // that an exchange needs one wait: lane A reads lane B's buffer of exchange
    // n after the wait that released the warp and before its own exchange
    // n + 1; B writes that buffer next at exchange n + 2, after the wait of
    // n + 1, which A must have reached. (This holds where the lanes of a warp
    // make the same exchanges and __syncwarp calls in the same order, as a
    // kernel must on a GPU.)
    // (A lane that has passed exchange n may also have exited before another
    // reads its buffer: what it published stays there.)
    uint64_t slots[2][WARP_SLOT_WORDS];
    unsigned exchanges;  // the exchanges it has made (the next publishes in slots[exchanges & 1])
};

static const size_t STACK_BYTES = 128 * 1024;
static const int MAX_THREADS = 1024;

static Fiber fibers[MAX_THREADS];
static int nthreads;
static Fiber* cur;
static void* sched_sp;
static bool fiber_mode;
static uint3 direct_idx;
static uint3 block_idx;
static dim3 grid_dim, block_dim;
static void (*body)(void*);
static void* body_arg;
static char error[512];
alignas(256) static char dyn_smem[228 * 1024];

static inline uint3& thread_idx() { return fiber_mode ? cur->idx : direct_idx; }

#if defined(__x86_64__)
// swap(save, load): saves the callee-saved registers on the current stack, stores
// the stack pointer in *save, and resumes the stack `load` (the layout
// `start_fiber` builds for a new fiber). The SSE and x87 control words are not
// switched: every fiber runs on the thread that launched it, and neither the
// kernels nor the simulator change rounding modes or exception masks, so they hold
// the same value in every fiber. (ldmxcsr and fldcw stall the pipeline: they held
// most of the swap's samples in a profile of the memory tests.)
extern "C" void ember_sim_swap(void** save, void* load) __attribute__((visibility("hidden")));
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl ember_sim_swap\n"
    ".hidden ember_sim_swap\n"
    ".type ember_sim_swap,@function\n"
    "ember_sim_swap:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size ember_sim_swap, .-ember_sim_swap\n");

static void fiber_main();

// A new fiber's stack: a frame that ember_sim_swap "returns" from into fiber_main.
static void* start_fiber(char* stack) {
    uintptr_t top = ((uintptr_t)(stack + STACK_BYTES)) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)top;
    *--sp = 0;                        // fiber_main's (never used) return address
    *--sp = (uint64_t)&fiber_main;    // where the first swap returns to
    for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
    return sp;
}
static inline void to_scheduler() { ember_sim_swap(&cur->sp, sched_sp); }
static inline void to_fiber(Fiber* f) { ember_sim_swap(&sched_sp, f->sp); }
#else
#error "ember's CUDA simulator supports x86-64 hosts"
#endif

static void fiber_main() {
    body(body_arg);
    cur->state = DONE;
    to_scheduler();
    abort();  // a finished fiber is never resumed
}

static inline void wait(int state) {
    if (!fiber_mode) {
        snprintf(error, sizeof error, "internal: barrier outside fiber mode");
        abort();
    }
    cur->state = state;
    to_scheduler();
}

static inline int linear_tid(const uint3& t) {
    return (int)(t.x + t.y * block_dim.x + t.z * block_dim.x * block_dim.y);
}

// The caller publishes `bytes` (at most 32) from `mine` at its warp's next
// exchange and waits until every live lane of the warp has; returns the
// exchange's number, for warp_lane.
static unsigned warp_publish(const void* mine, size_t bytes) {
    if (bytes > sizeof cur->slots[0]) {
        snprintf(error, sizeof error, "internal: a warp exchange of %zu bytes", bytes);
        abort();
    }
    const unsigned n = cur->exchanges++;
    memcpy(cur->slots[n & 1], mine, bytes);
    wait(AT_WARP);
    return n;
}

// What lane `i` of the caller's warp published at exchange `n` (null for a lane
// that exited before it or is past the block). It holds until the caller's next
// exchange (the lanes making the same exchanges in the same order).
static inline const void* warp_lane(int i, unsigned n) {
    const int s = (linear_tid(cur->idx) & ~31) + i;
    return s < nthreads && fibers[s].exchanges > n ? (const void*)fibers[s].slots[n & 1] : nullptr;
}

// Every lane of the caller's warp publishes `bytes` from `mine`; returns once all
// live lanes have, with lanes[i] what lane i published (warp_lane).
static void warp_all(const void* mine, size_t bytes, const void* lanes[32]) {
    const unsigned n = warp_publish(mine, bytes);
    for (int i = 0; i < 32; ++i) lanes[i] = warp_lane(i, n);
}

// Reads lane `src` (of the caller's warp) of the value every lane publishes: one
// lane's buffer, not the whole warp's.
template <class T> static T shfl(T v, int src, bool valid) {
    const unsigned n = warp_publish(&v, sizeof(T));
    T r = v;
    if (valid && src >= 0 && src < 32) {
        if (const void* p = warp_lane(src, n)) memcpy(&r, p, sizeof(T));
    }
    return r;
}

static inline int lane_id() { return fiber_mode ? linear_tid(cur->idx) & 31 : linear_tid(direct_idx) & 31; }

// EMBER_SIM_ORDER=reverse runs the blocks of a launch, and the threads of a block
// between barriers, last to first: a kernel whose result depends on the order
// (a thread reading what another wrote without a barrier, a block waiting on a
// later one) then fails where the usual first-to-last order hid it.
static bool reverse_order() {
    static int r = -1;
    if (r < 0) {
        const char* v = getenv("EMBER_SIM_ORDER");
        r = v && strcmp(v, "reverse") == 0;
    }
    return r != 0;
}

// Runs every block of the launch; returns 0, or -1 with `error` set.
static int run_launch(const Launch* l) {
    const bool rev = reverse_order();
    grid_dim = dim3(l->grid[0], l->grid[1], l->grid[2]);
    block_dim = dim3(l->block[0], l->block[1], l->block[2]);
    nthreads = (int)(block_dim.x * block_dim.y * block_dim.z);
    fiber_mode = l->fibers != 0;
    if (nthreads > MAX_THREADS) {
        snprintf(error, sizeof error, "a block of %d threads exceeds %d", nthreads, MAX_THREADS);
        return -1;
    }
    if (l->shared_mem > sizeof dyn_smem) {
        snprintf(error, sizeof error, "%u bytes of dynamic shared memory exceed the simulator's %zu",
                 l->shared_mem, sizeof dyn_smem);
        return -1;
    }
#ifdef __SANITIZE_ADDRESS__
    // under the memory checker, the dynamic shared memory past what the launch
    // asked for cannot be touched
    __asan_unpoison_memory_region(dyn_smem, sizeof dyn_smem);
    __asan_poison_memory_region(dyn_smem + l->shared_mem, sizeof dyn_smem - l->shared_mem);
#endif
    if (fiber_mode) {
        for (int i = 0; i < nthreads; ++i) {
            if (!fibers[i].stack) {
                fibers[i].stack = (char*)malloc(STACK_BYTES);
                if (!fibers[i].stack) {
                    snprintf(error, sizeof error, "out of host memory for thread stacks");
                    return -1;
                }
            }
        }
    }
    const unsigned long long nblocks = (unsigned long long)grid_dim.x * grid_dim.y * grid_dim.z;
    for (unsigned long long b = 0; b < nblocks; ++b) {
        const unsigned long long lb = rev ? nblocks - 1 - b : b;
        const unsigned bx = (unsigned)(lb % grid_dim.x);
        const unsigned by = (unsigned)((lb / grid_dim.x) % grid_dim.y);
        const unsigned bz = (unsigned)(lb / ((unsigned long long)grid_dim.x * grid_dim.y));
        block_idx = uint3{bx, by, bz};
        if (!fiber_mode) {
            for (int t = 0; t < nthreads; ++t) {
                const int i = rev ? nthreads - 1 - t : t;
                direct_idx = uint3{i % block_dim.x, (i / block_dim.x) % block_dim.y,
                                   i / (block_dim.x * block_dim.y)};
                body(body_arg);
            }
            continue;
        }
        for (int i = 0; i < nthreads; ++i) {
            Fiber& f = fibers[i];
            f.idx = uint3{i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
            f.state = RUNNABLE;
            f.exchanges = 0;
            f.sp = start_fiber(f.stack);
        }
        for (;;) {
            for (int t = 0; t < nthreads; ++t) {
                const int i = rev ? nthreads - 1 - t : t;
                if (fibers[i].state == RUNNABLE) {
                    cur = &fibers[i];
                    to_fiber(cur);
                }
            }
            // every thread now waits or is done: release a warp whose live
            // threads all wait at a warp-level exchange or __syncwarp, else the
            // block at __syncthreads
            int live = 0, at_block = 0;
            bool released = false;
            for (int w = 0; w < nthreads; w += 32) {
                int lw = 0, aw = 0;
                for (int i = w; i < w + 32 && i < nthreads; ++i) {
                    if (fibers[i].state != DONE) ++lw;
                    if (fibers[i].state == AT_WARP) ++aw;
                    if (fibers[i].state == AT_BLOCK) ++at_block;
                }
                live += lw;
                if (lw > 0 && aw == lw) {
                    for (int i = w; i < w + 32 && i < nthreads; ++i)
                        if (fibers[i].state == AT_WARP) fibers[i].state = RUNNABLE;
                    released = true;
                }
            }
            if (live == 0) break;
            if (released) continue;
            if (at_block == live) {
                for (int i = 0; i < nthreads; ++i)
                    if (fibers[i].state == AT_BLOCK) fibers[i].state = RUNNABLE;
                continue;
            }
            snprintf(error, sizeof error,
                     "deadlock in block (%u, %u, %u): %d of %d live threads wait at __syncthreads, "
                     "the others at a warp-level operation",
                     bx, by, bz, at_block, live);
            return -1;
        }
    }
    return 0;
}

template <class... A, size_t... I>
static std::tuple<A...> unpack(void** p, std::index_sequence<I...>) {
    return std::tuple<A...>(*(typename std::remove_reference<A>::type*)p[I]...);
}

// Calls kernel `k` with the parameters cuLaunchKernel would copy from `params`.
template <class... A> static int run(void (*k)(A...), void** params, const Launch* l) {
    auto args = unpack<A...>(params, std::index_sequence_for<A...>{});
    struct Call {
        void (*k)(A...);
        std::tuple<A...>* args;
    } call{k, &args};
    body = [](void* p) {
        Call* c = (Call*)p;
        std::apply(c->k, *c->args);
    };
    body_arg = &call;
    error[0] = 0;
    return run_launch(l);
}

// The sizes of kernel `k`'s parameters, the first `cap` of them into `out`; returns
// how many it has (what cuFuncGetParamInfo tells on a GPU).
template <class... A> static int param_sizes(void (*)(A...), unsigned long long* out, int cap) {
    const unsigned long long s[] = {sizeof(A)..., 0};
    int n = (int)sizeof...(A);
    for (int i = 0; i < n && i < cap; i++) out[i] = s[i];
    return n;
}

// Round-to-nearest-even conversions between f32 and IEEE half (what PTX's cvt.rn does).
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ex = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (ex == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? (0x200u | (man >> 13)) : 0u));
    int e = (int)ex - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)h;
}
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu, x;
    if (ex == 0) {
        if (man == 0) {
            x = sign;
        } else {
            int e = -1;
            do {
                ++e;
                man <<= 1;
            } while (!(man & 0x400u));
            x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (ex == 31) {
        x = sign | 0x7f800000u | (man << 13);
    } else {
        x = sign | ((ex - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

template <class To, class From> static inline To bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "sizes differ");
    To r;
    memcpy(&r, &v, sizeof r);
    return r;
}

}  // namespace ember_sim

#define threadIdx (::ember_sim::thread_idx())
#define blockIdx (::ember_sim::block_idx)
#define blockDim (::ember_sim::block_dim)
#define gridDim (::ember_sim::grid_dim)
#define warpSize 32

static inline void __syncthreads() { ::ember_sim::wait(::ember_sim::AT_BLOCK); }
static inline void __syncwarp(unsigned = 0xffffffffu) { ::ember_sim::wait(::ember_sim::AT_WARP); }
// The simulator's own warp-wide exchange (ember_sim::warp_all), for the
// emulations of warp-level matrix instructions in the kernels: one wait where a
// shuffle per element would take one each.
static inline void __ember_sim_warp_all(const void* mine, size_t bytes, const void* lanes[32]) {
    ::ember_sim::warp_all(mine, bytes, lanes);
}
static inline void __threadfence() {}
static inline void __threadfence_block() {}
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    int lane = ::ember_sim::lane_id();
    return ::ember_sim::shfl(v, (lane & ~(width - 1)) + (src % width), true);
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    int lane = ::ember_sim::lane_id();
    int src = lane + (int)d;
    return ::ember_sim::shfl(v, src, (src & ~(width - 1)) == (lane & ~(width - 1)));
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    int lane = ::ember_sim::lane_id();
    int src = lane - (int)d;
    return ::ember_sim::shfl(v, src, src >= 0 && (src & ~(width - 1)) == (lane & ~(width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
    int lane = ::ember_sim::lane_id();
    int src = lane ^ m;
    return ::ember_sim::shfl(v, src, (src & ~(width - 1)) == (lane & ~(width - 1)));
}

// Threads of one block run one at a time, so atomics are plain read-modify-writes.
template <class T, class V> static inline T __ember_sim_atomic_add(T* p, V v) {
    T old = *p;
    *p = (T)(old + (T)v);
    return old;
}
static inline float atomicAdd(float* p, float v) { return __ember_sim_atomic_add(p, v); }
static inline double atomicAdd(double* p, double v) { return __ember_sim_atomic_add(p, v); }
static inline int atomicAdd(int* p, int v) { return __ember_sim_atomic_add(p, v); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __ember_sim_atomic_add(p, v); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __ember_sim_atomic_add(p, v);
}
template <class T> static inline T atomicExch(T* p, T v) {
    T old = *p;
    *p = v;
    return old;
}
template <class T> static inline T atomicCAS(T* p, T cmp, T v) {
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}
template <class T> static inline T atomicMax(T* p, T v) {
    T old = *p;
    if (v > old) *p = v;
    return old;
}
template <class T> static inline T atomicMin(T* p, T v) {
    T old = *p;
    if (v < old) *p = v;
    return old;
}

template <class A, class B> static inline typename std::common_type<A, B>::type min(A a, B b) {
    return b < a ? b : a;
}
template <class A, class B> static inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}

static inline float __int_as_float(int v) { return ember_sim::bit_cast<float>(v); }
static inline int __float_as_int(float v) { return ember_sim::bit_cast<int>(v); }
static inline float __uint_as_float(unsigned v) { return ember_sim::bit_cast<float>(v); }
static inline unsigned __float_as_uint(float v) { return ember_sim::bit_cast<unsigned>(v); }
static inline double __longlong_as_double(long long v) { return ember_sim::bit_cast<double>(v); }
static inline long long __double_as_longlong(double v) { return ember_sim::bit_cast<long long>(v); }
// glibc declares functions of these names; CUDA's fast intrinsics map to libm here
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(x, y) powf(x, y)
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
static inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline uint16_t __ember_sim_f32_to_f16(float f) { return ember_sim::f32_to_f16(f); }
static inline float __ember_sim_f16_to_f32(uint16_t h) { return ember_sim::f16_to_f32(h); }

extern "C" __attribute__((visibility("default"))) const char* __ember_sim_error() { return ember_sim::error; }

// Whether the module's kernels may wait at barriers or shuffles (their threads then
// run as fibers), found by ember in the preprocessed source.
#define EMBER_SIM_FIBERS(n) extern "C" __attribute__((visibility("default"))) const int __ember_sim_fibers = n;

// The most threads per block of a kernel declared with __launch_bounds__.
#define EMBER_SIM_MAX_THREADS(name, n) \
    extern "C" __attribute__((visibility("default"))) const int __ember_sim_maxthreads_##name = (n);

#define EMBER_SIM_ENTRY(name)                                                                   \
    extern "C" __attribute__((visibility("default"))) int __ember_sim_entry_##name(             \
        void** params, const ember_sim::Launch* l) {                                           \
        return ember_sim::run(name, params, l);                                                 \
    }                                                                                           \
    extern "C" __attribute__((visibility("default"))) int __ember_sim_params_##name(            \
        unsigned long long* out, int cap) {                                                     \
        return ember_sim::param_sizes(name, out, cap);                                          \
    }
