#!/usr/bin/env python3
"""How far the float32 attention kernels' three tf32 products stray from a dot
product's exact value, for the split they use and for the one they used before.

kernels/attention.cu makes a float32 product a . b out of tf32 products: each
operand x = big + small, and a . b ~ a_big . b_big + a_big . b_small +
a_small . b_big. Two ways of splitting are compared here, over dot products of
64 standard-normal float32 pairs (a head dim of 64):

  rna/rna          big = x rounded to tf32 (cvt.rna), small = (x - big) rounded
                   the same way (the kernels until 2026-11-30)
  fma              no split: float32 multiply-adds in order, for scale (what the
                   float32 products would give without tensor cores)
  trunc/half-ulp   big = x with its 13 low mantissa bits cleared, small = x - big
                   with 0x1000 added to its bits, then cleared the same way as
                   the tensor cores read it (tf32_split: CUTLASS's fast float32
                   split, which PyTorch's float32 attention uses)

The products of tf32 parts are exact in float64 and their sums are within
about 1e-16 of exact, so this measures the split alone, not the tensor cores'
accumulation. The error is
given relative to sum |a_i b_i| (a dot product's natural scale) and beside
float32's half ulp (2^-24). Standard library only; deterministic.
"""
import random
import struct


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def flt(u):
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def f32(x):
    return flt(bits(x))


def rna(x):
    u = bits(x)
    if (u & 0x7F800000) != 0x7F800000:
        u += 0x1000
    return flt(u & 0xFFFFE000)


def split_rna(x):
    big = rna(x)
    return big, rna(f32(x - big))


def split_trunc(x):
    big = flt(bits(x) & 0xFFFFE000)
    small = f32(x - big)
    return big, flt((bits(small) + 0x1000) & 0xFFFFE000)


def main():
    rng = random.Random(0)
    for name, split in (("fma", None), ("rna/rna (before)", split_rna), ("trunc/half-ulp (now)", split_trunc)):
        rng.seed(0)
        errs = []
        for _ in range(2000):
            a = [f32(rng.gauss(0, 1)) for _ in range(64)]
            b = [f32(rng.gauss(0, 1)) for _ in range(64)]
            approx = 0.0
            for x, y in zip(a, b):
                if split is None:
                    approx = f32(x * y + approx)
                    continue
                xb, xs = split(x)
                yb, ys = split(y)
                approx += xs * yb + xb * ys + xb * yb
            exact = sum(x * y for x, y in zip(a, b))
            errs.append(abs(approx - exact) / sum(abs(x * y) for x, y in zip(a, b)))
        errs.sort()
        print(f"{name:22} error / sum|a_i b_i|: median {errs[len(errs) // 2]:.2e}, "
              f"largest {errs[-1]:.2e} (float32's half ulp: {2.0 ** -24:.2e})")


if __name__ == "__main__":
    main()
