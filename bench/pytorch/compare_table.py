"""ember's rows beside PyTorch's: one table of both medians and PyTorch's time over
ember's (above 1: ember is faster), with each framework's peak memory of a step
and ember's estimate where the rows have them (the models suite), each framework's
host time to queue a call where measured (GPU rows: near the median, the row
waits on the host), PyTorch's own reference rows, and their notes. Usage: compare_table.py EMBER.jsonl TORCH.jsonl
(the --json files of `ember bench` and device_ops.py, or their standard output:
lines that are not rows are skipped)."""
import json, sys
def load(path):
    """The rows of a JSON-lines file (other lines, such as a header, are skipped)."""
    rows = {}
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return rows
    for l in lines:
        try:
            r = json.loads(l)
        except ValueError:
            continue
        if isinstance(r, dict) and "name" in r and "device" in r:
            rows[(r["device"], r["name"])] = r
    return rows
e, t = load(sys.argv[1]), load(sys.argv[2])
fmt = lambda s: "-" if s is None else (f"{s:.3f} s" if s >= 1 else f"{s*1e3:.3f} ms" if s >= 1e-3 else f"{s*1e6:.2f} µs")
def size(b):
    if b is None:
        return "-"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
# the memory columns (models suite): the peak each framework measured, ember's estimate
memory = any(r.get("peak_bytes") is not None or r.get("estimate_bytes") is not None
             for r in list(e.values()) + list(t.values()))
# the host columns (GPU rows): each framework's time to queue a call
hosts = any(r.get("host_s") is not None for r in list(e.values()) + list(t.values()))
w = max([40] + [len(k[1]) for k in list(e) + list(t)])
def line(dev, name, em, pm, ratio, ep=None, tp=None, est=None, eh=None, th=None):
    host = f" {fmt(eh):>11} {fmt(th):>11}" if hosts else ""
    mem = f" {size(ep):>11} {size(tp):>11} {size(est):>11}" if memory else ""
    print(f"{dev:<8} {name:<{w}} {em:>11} {pm:>11} {ratio:>14}{host}{mem}")
hhead = f" {'ember host':>11} {'torch host':>11}" if hosts else ""
head = f" {'ember peak':>11} {'torch peak':>11} {'estimate':>11}" if memory else ""
print(f"\n{'device':<8} {'workload':<{w}} {'ember':>11} {'pytorch':>11} {'pytorch/ember':>14}{hhead}{head}")
notes = []
for k, r in e.items():
    p = t.get(k, {})
    ratio = f"{p['median_s'] / r['median_s']:.2f}" if p.get("median_s") and r.get("median_s") else "-"
    line(k[0], k[1], fmt(r["median_s"]), fmt(p.get("median_s")) if p else "-", ratio,
         r.get("peak_bytes"), p.get("peak_bytes"), r.get("estimate_bytes"),
         r.get("host_s"), p.get("host_s"))
# PyTorch's own rows (the reference rows of the models suite)
for k, p in t.items():
    if k not in e:
        line(k[0], k[1], "-", fmt(p.get("median_s")), "-", None, p.get("peak_bytes"),
             th=p.get("host_s"))
    if p.get("note"):
        notes.append(f"{k[0]} {k[1]}: {p['note']}")
for n in notes:
    print(f"note: {n}")
print(f"\npytorch: {next(iter(t.values()))['framework'] if t else 'not run'}")
