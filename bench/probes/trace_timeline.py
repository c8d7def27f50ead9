#!/usr/bin/env python3
"""Lines up ferry-bench's --timeline (client side) with the log of a ferryd run with
--trace-engine, for the 4 KiB latency copies (each one's steps, median [min, max]) and the
both-ways copies, and prints where each pair's time went, median [min,
max]: the client's Copy() call, submit to ferryd reading the request off the ring, reading it to
issuing the copies, issue to the engine starting, time on the
engine, engine done to ferryd seeing it, ferryd seeing it to the client's Wait returning.
(issue->engine and engine->seen carry the trace's GPU/host clock offset with opposite signs: their
sum is exact.)

usage: trace_timeline.py FERRYD_TRACE_LOG TIMELINE   (as written by bench/gpu/trace.sh)
"""
import re, statistics as S, sys

if len(sys.argv) != 3 or sys.argv[1] in ('-h', '--help'):
    print(__doc__)
    sys.exit(0 if len(sys.argv) == 2 else 2)
log,tl=sys.argv[1],sys.argv[2]
# ferryd moves its time zero now and then (a line saying so): each line counts from the last one.
zx=re.compile(r'time zero(?:,| moved to) (\d+) ns on CLOCK_MONOTONIC')
rx=re.compile(r'(h2d|d2h) stream (\d+), (\d+) bytes: (?:accepted (-?[0-9.]+), )?issued ([0-9.]+), on the engine ([0-9.]+) to ([0-9.]+), seen done ([0-9.]+)')
recs=[]
z=None
for l in open(log):
    mz=zx.search(l)
    if mz:
        z=int(mz.group(1))
        continue
    m=rx.search(l)
    if m and z is not None:
        d,s,b,acc,i,a,e,sn=m.groups(); i=z+float(i)*1e3
        recs.append((d,int(s),int(b),i,z+float(a)*1e3,z+float(e)*1e3,z+float(sn)*1e3,z+float(acc)*1e3 if acc else i))
T=[]
L=[]
for l in open(tl):
    m=re.search(r'rep (-?\d+): start (\d+), up submitted (\d+), down submitted (\d+), up done (\d+), down done (\d+)',l)
    if m: T.append(tuple(int(x) for x in m.groups()))
    m=re.search(r'timeline latency (h2d|d2h): start (\d+), submitted (\d+), done (\d+)',l)
    if m: L.append((m.group(1),)+tuple(int(x) for x in m.groups()[1:]))
if L:
    # 4 KiB latency copies: each one's trace line is the one of its direction that ferryd read
    # (accepted) between the client's start and done.
    recs_by_dir={d:sorted((r for r in recs if r[0]==d), key=lambda r: r[7]) for d in ('h2d','d2h')}
    for d in ('h2d','d2h'):
        lc={k:[] for k in ['call','start->accept','accept->issue','issue->engine','engine span','engine->client done','  engine->ferryd seen','total']}
        rs=recs_by_dir[d]; j=0
        for dd,st,sub,done in (x for x in L if x[0]==d):
            while j<len(rs) and rs[j][7]<st: j+=1
            if j>=len(rs) or rs[j][7]>done: continue
            r=rs[j]; j+=1
            v=[(sub-st)/1e3,(r[7]-st)/1e3,(r[3]-r[7])/1e3,(r[4]-r[3])/1e3,(r[5]-r[4])/1e3,(done-r[5])/1e3,(r[6]-r[5])/1e3,(done-st)/1e3]
            for k,x in zip(lc,v): lc[k].append(x)
        if not lc['total']: continue
        print("4 KiB %s through ferryd, %d copies:"%(d,len(lc['total'])))
        for k,v in lc.items(): print("  %-20s median %8.2f us  [%8.2f, %8.2f]"%(k,S.median(v),min(v),max(v)))
cols={k:[] for k in ['call','submit->issue','  submit->accept','  accept->issue','issue->engine','engine span','engine->seen','seen->client done','total']}
if not T: sys.exit(0)
for rep,st,us,ds,ud,dd in T:
    rr=[r for r in recs if st-1e6 < r[3] < dd]
    if not rr: continue
    i0=min(r[3] for r in rr); c0=min(r[7] for r in rr); a0=min(r[4] for r in rr); e1=max(r[5] for r in rr); s1=max(r[6] for r in rr)
    v=dict(zip(cols,[ (us-st)/1e3, (i0-us)/1e3, (c0-us)/1e3, (i0-c0)/1e3, (a0-i0)/1e3, (e1-a0)/1e3, (s1-e1)/1e3, (dd-s1)/1e3, (dd-st)/1e3]))
    for k in cols: cols[k].append(v[k])
for k,v in cols.items(): print("%-18s median %8.1f us  [%8.1f, %8.1f]"%(k,S.median(v),min(v),max(v)))
