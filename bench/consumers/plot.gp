# Plots bench/consumers/run.py results:
#   gnuplot -e "datafile='consumers_bench.dat'; outfile='consumers_bench.png'" plot.gp
# consumers_bench.dat: label messages_per_s (label quoted, one case per line).
set terminal pngcairo size 1300,520 font "sans,10"
set output outfile
set title "Messages processed once per second, against the raw loops (same broker, prefetch 64, 8 workers)"
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set grid ytics
set yrange [0:*]
set xtics rotate by -35 nomirror
set bmargin 9
set ylabel "messages/s"
plot datafile using 2:xtic(1) notitle linecolor rgb "#4878a8", \
     '' using 0:($2):(sprintf("%.0f", $2)) with labels offset 0,0.7 notitle
