#!/usr/bin/env python3
"""tail_ckpt.py STEM [WIN_S] [THRESH_MS]: events committed in the WIN_S seconds after each "checkpoint starting" against the rest."""
import sys, re, datetime, bisect
stem = sys.argv[1]; win = float(sys.argv[2]) if len(sys.argv) > 2 else 3; thr = float(sys.argv[3]) if len(sys.argv) > 3 else 20
ev = sorted(tuple(map(float, l.split())) for l in open(stem + '.txt')); ts = [e[0] for e in ev]
lines = open(stem + '.pglog.txt').read().splitlines()
st = float(re.search(r'unix ([0-9.]+)', lines[0]).group(1))
starts = []
for l in lines[1:]:
    m = re.match(r'(\S+ \S+) UTC .*checkpoint starting: (\S+)', l)
    if m:
        t = datetime.datetime.strptime(m.group(1), '%Y-%m-%d %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp() - st
        if 1 < t < ts[-1]: starts.append(t)
inside = [False] * len(ev)
for t in starts:
    i, j = bisect.bisect_left(ts, t), bisect.bisect_right(ts, t + win)
    xs = [ev[k][1] for k in range(i, j)]
    for k in range(i, j): inside[k] = True
    print(f'checkpoint start {t:7.1f}s: {len(xs)} events, >{thr:.0f} ms {sum(x > thr for x in xs)} ({100*sum(x > thr for x in xs)/max(len(xs),1):.1f}%), max {max(xs) if xs else 0:.1f}')
a = [e[1] for e, f in zip(ev, inside) if f]; b = [e[1] for e, f in zip(ev, inside) if not f]
p = lambda xs, q: sorted(xs)[int(q * len(xs))] if xs else float('nan')
print(f'within {win}s after a start: n={len(a)} >{thr:.0f}ms {100*sum(x > thr for x in a)/max(len(a),1):.2f}% p99 {p(a,.99):.1f}; rest: n={len(b)} >{thr:.0f}ms {100*sum(x > thr for x in b)/max(len(b),1):.2f}% p99 {p(b,.99):.1f}')
