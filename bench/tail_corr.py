#!/usr/bin/env python3
"""tail_corr.py STEM [THRESH_MS]: correlate a latency dump with pokes, server log and wait samples.
STEM is the dump path without .txt (PREFIX.<nano>)."""
import sys, re, datetime, bisect, collections
stem = sys.argv[1]; thr = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
ev = [tuple(map(float, l.split())) for l in open(stem + '.txt')]
ev.sort()
ts = [e[0] for e in ev]
def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs)-1, int(p*len(xs)))] if xs else float('nan')
intervals = []  # (start, end, label)
try:
    for l in open(stem + '.pokes.txt'):
        a, b, sql = l.split(' ', 2); intervals.append((float(a), float(b), 'poke ' + sql.strip()))
except FileNotFoundError: pass
try:
    lines = open(stem + '.pglog.txt').read().splitlines()
    st = float(re.search(r'unix ([0-9.]+)', lines[0]).group(1))
    for l in lines[1:]:
        m = re.match(r'(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) (\w+)', l)
        if not m: continue
        t = datetime.datetime.strptime(m.group(1), '%Y-%m-%d %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp() - st
        if t < 0: continue
        if 'checkpoint starting' in l: cs = t
        elif 'checkpoint complete' in l:
            intervals.append((cs if 'cs' in dir() else t, t, 'checkpoint'))
        elif 'automatic vacuum' in l or 'automatic analyze' in l:
            # logged at the end; elapsed comes on a later line: look ahead
            kind = 'autovacuum' if 'vacuum' in l else 'autoanalyze'
            intervals.append((t, t, kind + ' ' + l.split('of table')[1].split(':')[0].strip()))
        elif 'elapsed:' in l and intervals and intervals[-1][0] == intervals[-1][1] and intervals[-1][2].startswith('auto'):
            el = float(re.search(r'elapsed: ([0-9.]+) s', l).group(1)); s0, s1, lab = intervals[-1]
            intervals[-1] = (s1 - el, s1, lab)
        elif 'duration:' in l:
            d = float(re.search(r'duration: ([0-9.]+) ms', l).group(1))
            q = l.split('duration:')[1][:110]
            intervals.append((t - d/1000, t, 'slowstmt ' + q))
except FileNotFoundError: pass
intervals.sort()
# per-interval stats: events committed in [start-0.05, end+0.3]
print(f'{len(ev)} events; overall p50 {pct([e[1] for e in ev],.5):.2f} p99 {pct([e[1] for e in ev],.99):.2f}; >{thr}ms: {sum(1 for e in ev if e[1]>thr)}')
cover = [False]*len(ev)
bykind = collections.defaultdict(lambda: [0, 0, 0.0, []])
for a, b, lab in intervals:
    if lab.startswith('slowstmt'): continue
    i, j = bisect.bisect_left(ts, a - 0.05), bisect.bisect_right(ts, b + 0.3)
    xs = [ev[k][1] for k in range(i, j)]
    for k in range(i, j): cover[k] = True
    kind = lab.split()[0] + ' ' + (lab.split()[1] if lab.startswith('poke') else '')
    bk = bykind[kind]; bk[0] += len(xs); bk[1] += sum(1 for x in xs if x > thr); bk[2] += (b - a); bk[3] += xs
    print(f'{a:8.2f}-{b:8.2f} ({b-a:5.2f}s) {lab[:60]:60s} n={len(xs):5d} >{thr:.0f}ms={sum(1 for x in xs if x>thr):4d} max={max(xs) if xs else 0:7.2f}')
rest = [ev[k][1] for k in range(len(ev)) if not cover[k]]
print('--- per kind: events, events >thr, share')
for k, (n, m, dur, xs) in sorted(bykind.items()):
    print(f'{k:24s} n={n:7d} >thr={m:5d} ({100*m/max(n,1):.2f}%) p99={pct(xs,.99):.2f} time={dur:.1f}s')
print(f'{"outside all":24s} n={len(rest):7d} >thr={sum(1 for x in rest if x>thr):5d} ({100*sum(1 for x in rest if x>thr)/max(len(rest),1):.2f}%) p99={pct(rest,.99):.2f}')
print('--- slow statements (log_min_duration_statement)')
for a, b, lab in intervals:
    if lab.startswith('slowstmt'): print(f'{a:8.2f}-{b:8.2f} {lab[:130]}')
print('--- worst events and the intervals around them')
worst = sorted(ev, key=lambda e: -e[1])[:15]
for t, l in sorted(worst):
    near = [lab[:40] for a, b, lab in intervals if a - 1 <= t <= b + 1]
    print(f'{t:8.3f} {l:7.2f}ms  {near}')
