#!/usr/bin/env python3
"""Static instruction counts of ember's kernels, from their machine code (SASS).

Without a GPU, a kernel's speed cannot be measured; what its inner loop executes
can be counted. This reads cubins written by the NVRTC compile test and prints,
for each kernel whose name matches:

  regs      registers per thread and bytes spilled (ptxas's report beside the cubin)
  total     instructions in the kernel
  loop      instructions in its largest loop that holds a tensor-core product
            (HMMA): the attention kernels' step over tiles
  hot       the same loop without the blocks that a predicated branch skips and
            that hold the dropout hash's multipliers (a run without dropout
            skips them)
  and the loop's counts of a few instruction kinds.

A static count is not a time: a loop may hold two variants of a part of which a
step runs one (the attention kernels' masked and all-visible score loops).
Compare counts of one kernel before and after a change, not across kernels.

Cubins (sm_90; NVRTC and a disassembler from PyPI, no GPU needed):
  python3 -m pip install --target /tmp/nvrtc nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96
  python3 -m pip install --target /tmp/nvdis nvidia-cuda-nvdisasm==13.2.86 nvidia-cuda-cuobjdump==13.2.86
  L=/tmp/nvrtc/nvidia/cu13; mkdir -p /tmp/cubins
  EMBER_KERNEL_FILE=attention EMBER_KERNEL_DUMP=/tmp/cubins EMBER_CUDA_LIB_DIR=$L/lib \\
    EMBER_CUDA_INCLUDE_DIR=$L/include EMBER_REQUIRE_NVRTC=1 \\
    cargo test -p ember --lib -- every_kernel_compiles_for_hopper
  bench/sass_loops.py --match 'attn_(fwd|bwd_kv|bwd_q)_bf16_d64$' /tmp/cubins/attention_bf16_sm90.cubin
"""
import argparse
import collections
import os
import re
import subprocess
import sys

# splitmix64's multipliers, as the attention kernels' dropout hash holds them
# (their halves; SASS prints those with the top bit set as negative numbers)
DROPOUT_HASH = ("0x1ce4e5b9", "-0x40a7b893", "0x133111eb", "-0x6b2fb645")
KINDS = ("HMMA", "MUFU", "F2FP", "LDSM", "LDGSTS", "BRA")


def functions(cuobjdump, cubin):
    out = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    fns, cur = {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = fns.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return fns


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def largest_loop(ins):
    """The body of the backward branch that spans the most instructions and holds an HMMA."""
    best = []
    for addr, text in ins:
        m = re.search(r"BRA 0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= addr:
            continue
        body = [x for x in ins if int(m.group(1), 16) <= x[0] <= addr]
        if len(body) > len(best) and any(opcode(t) == "HMMA" for _, t in body):
            best = body
    return best


def without_dropout(body):
    """The body less the blocks a forward branch skips that hold the dropout hash and no product."""
    if not body:
        return body
    end, skipped = body[-1][0], set()
    for addr, text in body:
        m = re.match(r"@!?U?P\w+\s+BRA 0x([0-9a-f]+)", text)
        if not m or not addr < int(m.group(1), 16) <= end:
            continue
        block = [x for x in body if addr < x[0] < int(m.group(1), 16)]
        if any(h in t for _, t in block for h in DROPOUT_HASH) and not any(opcode(t) == "HMMA" for _, t in block):
            skipped.update(a for a, _ in block)
    return [x for x in body if x[0] not in skipped]


def resources(cubin):
    log = os.path.splitext(cubin)[0] + ".log"
    found = {}
    if os.path.exists(log):
        text = open(log).read()
        pat = (r"Function properties for (\S+)\n.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
               r"(\d+) bytes spill loads\nptxas info\s+: Used (\d+) registers")
        for m in re.finditer(pat, text):
            found[m.group(1)] = (int(m.group(5)), int(m.group(3)))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cubins", nargs="+")
    ap.add_argument("--match", default=".", help="a regular expression the kernels' names must contain")
    ap.add_argument("--cuobjdump", default=os.environ.get("CUOBJDUMP", "/tmp/nvdis/nvidia/cu13/bin/cuobjdump"))
    args = ap.parse_args()
    for cubin in args.cubins:
        res = resources(cubin)
        for name, ins in sorted(functions(args.cuobjdump, cubin).items()):
            if not re.search(args.match, name):
                continue
            loop = largest_loop(ins)
            if not loop:
                sys.exit(f"{name}: no loop with a tensor-core product found (is the disassembly's form new?)")
            hot = without_dropout(loop)
            if len(hot) == len(loop) and any(h in t for _, t in ins for h in DROPOUT_HASH):
                print(f"warning: {name}: its dropout hash lies outside the loop's skipped blocks", file=sys.stderr)
            kinds = collections.Counter(opcode(t) for _, t in loop)
            regs, spill = res.get(name, ("?", "?"))
            print(f"{name:32} regs {regs:>3} spill {spill:>3}  total {len(ins):5}  loop {len(loop):5}  "
                  f"hot {len(hot):5}  " + " ".join(f"{k} {kinds[k]}" for k in KINDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
