# gnuplot -e "out='../docs/benchmarks.png'" plot.gp   (reads throughput.dat, latency.dat)
if (!exists("out")) out = "../docs/benchmarks.png"
set terminal pngcairo size 1200,500 font "sans,10"
set output out
set multiplot layout 1,2 title "outboxd on 2 cores (Postgres 15, Redis 7 on the same machine), medians"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set key top left
set title "Backlog drain, 100k rows (events/s)"
set ylabel "events/s"
set xtics rotate by -20
plot "throughput.dat" using 2:xtic(1) title "outboxd" lc rgb "#2b6cb0", "" using 3 title "watermill-sql forwarder" lc rgb "#c05621"
set title "Commit to delivered at 1,000 events/s (ms)"
set ylabel "ms"
plot "latency.dat" using 2:xtic(1) title "NOTIFY off (default)" lc rgb "#2b6cb0", "" using 3 title "NOTIFY on" lc rgb "#2f855a"
unset multiplot
