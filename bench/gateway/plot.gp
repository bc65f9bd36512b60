# Plots bench/gateway/run.sh results. Call with:
#   gnuplot -e "datafile='results.dat'; outfile='gateway_bench.png'; subtitle='...'" plot.gp
# results.dat columns: label req_per_s p50_ms p99_ms (label quoted, one case per line).
if (!exists("subtitle")) subtitle = ""

set terminal pngcairo size 1300,520 font "sans,10"
set output outfile
set multiplot layout 1,2 title "idem-gateway vs nginx, same static upstream\n{/*0.8 ".subtitle."}"

set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set grid ytics
set yrange [0:*]
set xtics rotate by -30 nomirror
set bmargin 8
set key top right

set title "Throughput"
set ylabel "requests/s"
plot datafile using 2:xtic(1) title "req/s" linecolor rgb "#4878a8", \
     '' using 0:($2):(sprintf("%.0f", $2)) with labels offset 0,0.7 notitle

set title "Latency (log scale)"
set ylabel "ms"
set logscale y
set yrange [0.1:*]
set key top left
set style histogram clustered gap 1
plot datafile using 3:xtic(1) title "p50" linecolor rgb "#6aa56a", \
     '' using 4 title "p99" linecolor rgb "#c8683f"

unset multiplot
