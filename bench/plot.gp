# gnuplot -e "out='../docs/benchmarks.png'" plot.gp   (reads throughput.dat, latency.dat; written by go run ./blackbox -report)
if (!exists("out")) out = "../docs/benchmarks.png"
set terminal pngcairo size 1200,500 font "sans,10"
set output out
set multiplot layout 1,2 title "outboxd, the built binary, Postgres and Redis on the same 2 cores (medians)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set key top right
set title "Backlog drain, 100k events, no-op sink (events/s)"
set ylabel "events/s"
set yrange [0:*]
plot "throughput.dat" using 2:xtic(1) title "outboxd" lc rgb "#2b6cb0", "" using 3 title "watermill-sql forwarder" lc rgb "#c05621"
set title "Commit to delivered (ms)"
set yrange [0:*]
set ylabel "ms"
plot "latency.dat" using 2:xtic(1) title "p50" lc rgb "#2b6cb0", "" using 3 title "p99" lc rgb "#2f855a"
unset multiplot
