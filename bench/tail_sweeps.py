#!/usr/bin/env python3
"""tail_sweeps.py PGLOG START_UNIX END_UNIX: the sweep statements logged (log_min_duration_statement) in a run's time range, and every other statement over 15 ms by kind."""
import sys, re, datetime, collections
log, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
ents, cur = [], None
for l in open(log):
    m = re.match(r'(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC', l)
    if m:
        cur = [datetime.datetime.strptime(m.group(1), '%Y-%m-%d %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp(), l]
        ents.append(cur)
    elif cur: cur[1] += l
kinds = collections.defaultdict(list)
for t, txt in ents:
    if not (t0 <= t <= t1) or 'duration:' not in txt: continue
    d = float(re.search(r'duration: ([0-9.]+) ms', txt).group(1))
    if 'DELETE FROM outbox' in txt: k = 'sweep: purge'
    elif 'SELECT attempts' in txt: k = 'sweep: attempts'
    elif 'SELECT id, created_at, aggregate_type' in txt: k = 'sweep: pending rows'
    elif 'INSERT INTO outbox' in txt: k = 'producer insert'
    elif 'WITH snap AS' in txt: k = 'relay read'
    elif 'WITH cur AS' in txt: k = 'relay fenced write (mark, cursor)'
    elif 'bind' in txt.split('duration:')[1][:20]: k = 'bind (planning) other'
    else: k = 'other: ' + txt.split('duration:')[1][10:60].replace('\n', ' ')
    kinds[k].append((t - t0, d))
for k, v in sorted(kinds.items()):
    ds = [d for _, d in v]
    print(f'{k:40s} n={len(v):4d} total={sum(ds):8.0f} ms max={max(ds):7.1f}' + ('  at ' + ', '.join(f'{t:.0f}s:{d:.0f}' for t, d in v) if k.startswith('sweep') else ''))
