package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

var (
	report      = flag.Bool("report", false, "run every measure of BENCHMARKS.md against one build, rewrite its tables (between the report: markers), bench/*.dat and docs/benchmarks.png (with gnuplot)")
	reportSmoke = flag.Bool("report-smoke", false, "as -report, each measure at toy size, into a copy of BENCHMARKS.md and a temporary folder: checks the command in seconds")
	reportOnly  = flag.String("report-only", "", "-report: only these measures, a comma list (drain, outside, backlog, history, latency, held, slow, pooler, dead-readers, backends, console, sinks)")
	reportMD    = flag.String("report-md", "../BENCHMARKS.md", "-report: the report to rewrite")
	reportPNG   = flag.String("report-png", "../docs/benchmarks.png", "-report: the plot to draw")
)

// measure is one section of the report: the invocations of this command
// that measure it (flags after -bin), at full and at toy size, and how
// their output becomes the section's table.
type measure struct {
	name         string
	runs, smokes [][]string
	render       func(outs []string, plot *plotData) (string, error)
}

// plotData collects what docs/benchmarks.png shows.
type plotData struct {
	throughput []string // "label" outboxd peer
	latency    []string // "label" p50 p99
}

var measures = []measure{
	{"drain",
		[][]string{{"-scenario", "drain", "-batches", "1000,100", "-rounds", "3"}},
		[][]string{{"-scenario", "drain", "-batches", "100", "-rounds", "1", "-rows", "300", "-peer=false"}},
		renderDrain},
	{"outside",
		[][]string{
			{"-scenario", "drain", "-batches", "1000", "-rounds", "3", "-peer=false", "-bare=false"},
			{"-scenario", "drain", "-batches", "1000", "-rounds", "3", "-peer=false", "-bare=false", "-as-written"},
		},
		[][]string{
			{"-scenario", "drain", "-batches", "100", "-rounds", "1", "-rows", "300", "-peer=false", "-bare=false"},
			{"-scenario", "drain", "-batches", "100", "-rounds", "1", "-rows", "300", "-peer=false", "-bare=false", "-as-written"},
		},
		renderOutside},
	{"backlog",
		[][]string{{"-scenario", "backlog", "-rows", "1000000", "-small", "100000", "-rounds", "1"}},
		[][]string{{"-scenario", "backlog", "-rows", "400", "-small", "200", "-rounds", "1"}},
		renderTables},
	{"history",
		[][]string{
			{"-scenario", "history", "-as-written", "-rows", "100000", "-history", "1000000", "-rounds", "3"},
			{"-scenario", "history", "-as-written", "-rows", "100000", "-history", "1000000", "-rounds", "3", "-history-cursor", "saved"},
		},
		[][]string{
			{"-scenario", "history", "-as-written", "-rows", "200", "-history", "400", "-rounds", "1"},
			{"-scenario", "history", "-as-written", "-rows", "200", "-history", "400", "-rounds", "1", "-history-cursor", "saved"},
		},
		renderHistory},
	{"latency",
		[][]string{
			{"-scenario", "latency", "-rate", "1000", "-runs", "3"},
			{"-scenario", "latency", "-tracing", "off,on", "-rate", "5000", "-per-tx", "5", "-runs", "3"},
		},
		[][]string{{"-scenario", "latency", "-rate", "100", "-for", "2s", "-runs", "1"}},
		renderLatency},
	{"held",
		[][]string{{"-scenario", "latency", "-rate", "2000", "-for", "10m", "-window", "1m", "-runs", "1", "-hold-snapshot"}},
		[][]string{{"-scenario", "latency", "-rate", "100", "-for", "2s", "-window", "1s", "-runs", "1", "-hold-snapshot"}},
		renderHeld},
	{"slow",
		[][]string{{"-scenario", "slow", "-rounds", "3", "-rows", "20000", "-receiver-delay", "20ms", "-aggregates", "1000", "-straggler", "0,500ms", "-concurrency", "512,16"}},
		[][]string{{"-scenario", "slow", "-rounds", "1", "-rows", "200", "-receiver-delay", "1ms", "-aggregates", "10", "-concurrency", "4"}},
		renderTables},
	{"pooler",
		[][]string{
			{"-scenario", "drain", "-batches", "1000", "-rounds", "3", "-peer=false", "-bare=false"},
			{"-scenario", "drain", "-batches", "1000", "-rounds", "3", "-peer=false", "-bare=false", "-pgbouncer"},
			{"-scenario", "latency", "-rate", "1000", "-runs", "3"},
			{"-scenario", "latency", "-rate", "1000", "-runs", "3", "-pgbouncer"},
		},
		[][]string{
			{"-scenario", "drain", "-batches", "100", "-rounds", "1", "-rows", "300", "-peer=false", "-bare=false"},
			{"-scenario", "drain", "-batches", "100", "-rounds", "1", "-rows", "300", "-peer=false", "-bare=false", "-pgbouncer"},
		},
		renderPooler},
	{"dead-readers",
		[][]string{{"-scenario", "dead-readers", "-rounds", "3", "-rows", "20000", "-dead", "200000", "-readers", "32", "-batches", "1000"}},
		[][]string{{"-scenario", "dead-readers", "-rounds", "1", "-rows", "200", "-dead", "2000", "-readers", "4", "-batches", "100"}},
		renderTables},
	{"backends",
		[][]string{
			{"-scenario", "drain", "-batches", "1000", "-rounds", "3", "-peer=false", "-bare=false", "-backends", reportBackends},
			{"-scenario", "latency", "-rate", "1000", "-runs", "3", "-backends", reportBackends},
			{"-scenario", "lease", "-runs", "3", "-backends", reportBackends},
		},
		[][]string{
			{"-scenario", "drain", "-batches", "100", "-rounds", "1", "-rows", "300", "-peer=false", "-bare=false", "-backends", reportBackends},
			{"-scenario", "latency", "-rate", "100", "-for", "2s", "-runs", "1", "-backends", reportBackends},
			{"-scenario", "lease", "-runs", "1", "-lease-ttl", "2s", "-backends", reportBackends},
		},
		renderBackends},
	{"console",
		[][]string{{"-scenario", "console", "-rounds", "3", "-rows", "100000", "-console-clients", "1", "-console-every", "1s", "-batches", "1000"}},
		[][]string{{"-scenario", "console", "-rounds", "1", "-rows", "300", "-console-every", "100ms", "-batches", "100"}},
		renderTables},
	{"sinks",
		[][]string{
			{"-rounds", "1", "-peer=false", "-bare=false", "-batches", "1000", "-sink", "noop,webhook,kafka,nats,rabbitmq,redis_stream,pubsub,kinesis"},
			{"-rounds", "1", "-peer=false", "-bare=false", "-rows", "2000", "-batches", "500", "-sink", "sqs,sns", "-set", "poller.concurrency=2"},
		},
		[][]string{{"-rounds", "1", "-peer=false", "-bare=false", "-rows", "200", "-batches", "100", "-sink", "noop,webhook"}},
		renderTables},
}

// runReport runs the measures against bin and rewrites the report. A
// measure that fails (a broker not up) leaves its section saying so; the
// others are still written.
func runReport(bin string) {
	md, png, dir := *reportMD, *reportPNG, "."
	if *reportSmoke {
		tmp, err := os.MkdirTemp("", "outboxd-report")
		check(err)
		orig, err := os.ReadFile(md)
		check(err)
		md, png, dir = filepath.Join(tmp, "BENCHMARKS.md"), filepath.Join(tmp, "benchmarks.png"), tmp
		check(os.WriteFile(md, orig, 0o644))
	}
	only := map[string]bool{}
	for _, n := range strings.Split(*reportOnly, ",") {
		if n = strings.TrimSpace(n); n != "" {
			only[n] = true
		}
	}
	doc, err := os.ReadFile(md)
	check(err)
	text := string(doc)
	var plot plotData
	for _, m := range measures {
		if len(only) > 0 && !only[m.name] {
			continue
		}
		invocations := m.runs
		if *reportSmoke {
			invocations = m.smokes
		}
		table, err := runMeasure(bin, m, invocations, &plot)
		if err != nil {
			fmt.Fprintf(os.Stderr, "blackbox: report: %s: %v\n", m.name, err)
			table = fmt.Sprintf("Not measured: %v.\n", err)
		}
		text, err = replaceSection(text, m.name, "Measured on "+hostWord()+".\n\n"+table)
		check(err)
	}
	check(os.WriteFile(md, []byte(text), 0o644))
	fmt.Printf("report: wrote %s\n", md)
	writePlot(dir, png, plot)
}

// runMeasure runs a measure's invocations of this command, each with the
// one build, and renders their output.
func runMeasure(bin string, m measure, invocations [][]string, plot *plotData) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	var outs []string
	for _, args := range invocations {
		full := append([]string{"-bin", "outboxd=" + bin, "-dsn", *pgDSN, "-redis", *redisAddr, "-pg", *pgMode}, args...)
		fmt.Printf("report: %s: blackbox %s\n", m.name, strings.Join(args, " "))
		var out bytes.Buffer
		cmd := exec.Command(self, full...)
		cmd.Stdout, cmd.Stderr = io.MultiWriter(os.Stdout, &out), os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("blackbox %s: %w", strings.Join(args, " "), err)
		}
		outs = append(outs, out.String())
	}
	return m.render(outs, plot)
}

// replaceSection puts body between <!-- report:name --> and
// <!-- /report:name -->.
func replaceSection(doc, name, body string) (string, error) {
	open, end := "<!-- report:"+name+" -->\n", "<!-- /report:"+name+" -->"
	i := strings.Index(doc, open)
	j := strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("report: no %s ... %s section in the report", strings.TrimSpace(open), end)
	}
	return doc[:i+len(open)] + body + doc[j:], nil
}

// hostWord names the host the way the report's method section does.
func hostWord() string {
	model, mem := "", ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if m := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); m != nil {
			model = " (" + string(m[1]) + ")"
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if m := regexp.MustCompile(`(?m)^MemTotal:\s*(\d+) kB`).FindSubmatch(b); m != nil {
			kb, _ := strconv.ParseFloat(string(m[1]), 64)
			mem = fmt.Sprintf(", %.0f GiB", kb/(1<<20))
		}
	}
	return fmt.Sprintf("%d vCPUs%s%s, %s, load %s at the end", runtime.NumCPU(), model, mem, runtime.Version(), strings.Fields(loadAvg())[0])
}

// lastTable returns the rows of the last Markdown table in out, header and
// separator included.
func lastTable(out string) []string {
	var cur, last []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "|") {
			cur = append(cur, l)
			continue
		}
		if len(cur) > 0 {
			last, cur = cur, nil
		}
	}
	if len(cur) > 0 {
		last = cur
	}
	return last
}

// cells splits a Markdown table row.
func cells(row string) []string {
	parts := strings.Split(strings.Trim(row, "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// renderTables keeps each invocation's summary table as the command printed it.
func renderTables(outs []string, _ *plotData) (string, error) {
	var b strings.Builder
	for _, out := range outs {
		t, err := resultTable(out)
		if err != nil {
			return "", err
		}
		b.WriteString(t + "\n\n")
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// resultTable is the summary table an invocation printed last.
func resultTable(out string) (string, error) {
	t := lastTable(out)
	if len(t) < 3 {
		return "", fmt.Errorf("no result table in the output")
	}
	return strings.Join(t, "\n"), nil
}

// renderHistory puts the two invocations' tables, a first start and a
// restart with the cursor saved, under a line saying which is which.
var renderHistory = renderPairs(
	"First start, no cursor saved (`-history-cursor none`): the relay finds the lowest pending row by a walk of the pending index in id order, through the history's entries below it:",
	"Restart of the relay that delivered the history, its cursor saved at the history's last id (`-history-cursor saved`):")

// renderPooler puts each pair of invocations' tables, direct and through
// PgBouncer, under a line saying which is which.
var renderPooler = renderPairs(
	"Direct to Postgres (`postgres.pooler: none`):",
	"Through PgBouncer 1.18, `pool_mode = transaction` (`postgres.pooler: transaction`):")

// renderPairs renders invocations run in pairs: each table under its
// pair's first label or second.
func renderPairs(first, second string) func(outs []string, _ *plotData) (string, error) {
	return func(outs []string, _ *plotData) (string, error) {
		var b strings.Builder
		for i, out := range outs {
			t, err := resultTable(out)
			if err != nil {
				return "", err
			}
			label := first
			if i%2 == 1 {
				label = second
			}
			b.WriteString(label + "\n\n" + t + "\n\n")
		}
		return strings.TrimSuffix(b.String(), "\n"), nil
	}
}

// renderOutside sets the drain as the report times it (a CHECKPOINT before
// the backlog's insert, VACUUM ANALYZE after it) beside the same drain on
// the table as the inserts left it, as one timing it from outside starts
// a relay on a fresh backlog; the goal is within 10%.
func renderOutside(outs []string, _ *plotData) (string, error) {
	if len(outs) != 2 {
		return "", fmt.Errorf("outside: want 2 outputs, got %d", len(outs))
	}
	var rates [2]string
	var medians [2]float64
	for i, out := range outs {
		t := lastTable(out)
		if len(t) < 3 {
			return "", fmt.Errorf("no result table in the output")
		}
		col := slices.IndexFunc(cells(t[0]), func(c string) bool { return strings.HasPrefix(c, "outboxd (binary) ev/s") })
		row := cells(t[2])
		if col < 0 || col >= len(row) {
			return "", fmt.Errorf("outside: no outboxd ev/s column")
		}
		m, ok := middle(row[col])
		if !ok {
			return "", fmt.Errorf("outside: cannot read %q", row[col])
		}
		rates[i], medians[i] = row[col], m
	}
	ratio := medians[1] / medians[0]
	mark := "✔"
	if ratio < 0.9 || ratio > 1.1 {
		mark = "✘"
	}
	return fmt.Sprintf(`| method | ev/s min / median / max | against the report's method | target |
|---|---|---|---|
| the report's: CHECKPOINT before the insert, VACUUM ANALYZE after | %s | 100%% | |
| from outside: the table as the inserts left it | %s | %.1f%% | within 10%% %s |
`, rates[0], rates[1], 100*ratio, mark), nil
}

// reportBackends are the lease backends the report measures side by side
// (backendSettings); one the build refuses or whose server is missing is
// skipped, and its rows are absent.
const reportBackends = "redis,postgres,postgres-only,etcd"

// renderBackends gives, per lease backend, the drain table, the 1k ev/s
// latency rows and the handover and takeover table, with the backends the
// run skipped named.
func renderBackends(outs []string, plot *plotData) (string, error) {
	if len(outs) != 3 {
		return "", fmt.Errorf("backends: want 3 outputs, got %d", len(outs))
	}
	var skipped []string
	for _, l := range strings.Split(outs[0], "\n") {
		if strings.HasPrefix(l, "backend ") && strings.Contains(l, " skipped") {
			skipped = append(skipped, l)
		}
	}
	drain, err := renderTables(outs[:1], plot)
	if err != nil {
		return "", err
	}
	lat, err := renderLatency(outs[1:2], &plotData{})
	if err != nil {
		return "", err
	}
	lease, err := renderTables(outs[2:], plot)
	if err != nil {
		return "", err
	}
	b := drain + "\n" + lat + "\n" + lease
	if len(skipped) > 0 {
		b += "\nSkipped: " + strings.Join(skipped, "; ") + "\n"
	}
	return b, nil
}

// middle is the median of "min / median / max".
func middle(mmm string) (float64, bool) {
	parts := strings.Split(mmm, " / ")
	if len(parts) != 3 {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(parts[1]), 64)
	return f, err == nil
}

// renderDrain turns the drain's summary into the peer table (watermill-sql
// and the bare protocol beside outboxd) and the ceiling table: the host's
// cores divided by the CPU seconds one event costs the relay, Postgres and
// Redis together.
func renderDrain(outs []string, plot *plotData) (string, error) {
	t := lastTable(outs[0])
	if len(t) < 3 {
		return "", fmt.Errorf("no drain table in the output")
	}
	cores := runtime.NumCPU()
	peer := "| batch | outboxd ev/s (min / median / max) | watermill-sql forwarder msg/s | ratio of medians (target ≥ 2.5× at batch 1000) | bare protocol ev/s | share of the bare protocol (target ≥ 80%) | peak RSS MiB |\n|---|---|---|---|---|---|---|\n"
	ceiling := fmt.Sprintf("| batch | ev/s (median) | CPU s per 1k events: the relay (or the bare protocol's loop) / Postgres / Redis | CPU ceiling (%d cores) | share of the ceiling |\n|---|---|---|---|---|\n", cores)
	for _, row := range t[2:] {
		c := cells(row) // build, sink, batch, ours, theirs, ratio, rss, cpu, bare, share, bare's cpu
		if len(c) < 10 {
			return "", fmt.Errorf("drain row %q: want 10 cells", row)
		}
		peer += fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s |\n", c[2], c[3], c[4], c[5], c[8], c[9], c[6])
		ours, ok := middle(c[3])
		perK, summed := cpuSum(c[7])
		if !ok || !summed {
			return "", fmt.Errorf("drain row %q: no rate or CPU", row)
		}
		limit := float64(cores) * 1000 / perK
		ceiling += fmt.Sprintf("| %s | %.0f | %s (%.4f) | %.0f ev/s | %.0f%% |\n", c[2], ours, c[7], perK, limit, 100*ours/limit)
		if len(c) > 10 {
			ceiling += bareCeiling(c[2], c[8], c[10], cores)
		}
		theirs, _ := middle(c[4])
		plot.throughput = append(plot.throughput, fmt.Sprintf("%q %.0f %.0f", "batch "+c[2], ours, theirs))
	}
	return peer + "\n" + ceiling, nil
}

// bareCeiling is the ceiling table's row for the bare protocol at batch:
// its median rate (rates, "min / median / max") against the same ceiling
// made of its own CPU per 1k events (cpu, "bench / Postgres / Redis"), or
// nothing when it did not run.
func bareCeiling(batch, rates, cpu string, cores int) string {
	rate, ok := middle(rates)
	perK, summed := cpuSum(cpu)
	if !ok || !summed {
		return ""
	}
	limit := float64(cores) * 1000 / perK
	return fmt.Sprintf("| %s, bare protocol | %.0f | %s (%.4f) | %.0f ev/s | %.0f%% |\n", batch, rate, cpu, perK, limit, 100*rate/limit)
}

// cpuSum adds up a "a / b / c" cell of CPU seconds; false when a part is
// not a number or the sum is not positive.
func cpuSum(cell string) (float64, bool) {
	var sum float64
	for _, f := range strings.Split(cell, " / ") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return 0, false
		}
		sum += x
	}
	return sum, sum > 0
}

// runLine is one latency run's result line.
var runLine = regexp.MustCompile(`^run \d+ (.*?): (\d+) ev/s x(\d+) per tx.*commit → marked p50 ([\d.]+) ms\s+p95 ([\d.]+) ms\s+p99 ([\d.]+) ms.*producer tx p50 [\d.]+ p99 ([\d.]+) max [\d.]+ ms.*relay CPU s/1k events ([\d.]+)`)

// renderLatency gives one row per rate and label: each run's p50, p99, the
// p99 of the producers' own transactions in that run (what the server's
// commit path did meanwhile: rows wait for it too) and relay CPU.
func renderLatency(outs []string, plot *plotData) (string, error) {
	type key struct{ label, rate string }
	var order []key
	p50, p99, prod, cpu := map[key][]string{}, map[key][]string{}, map[key][]string{}, map[key][]string{}
	for _, out := range outs {
		for _, l := range strings.Split(out, "\n") {
			m := runLine.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			k := key{m[1], fmt.Sprintf("%s ev/s (%s per transaction)", m[2], m[3])}
			if _, seen := p50[k]; !seen {
				order = append(order, k)
			}
			p50[k], p99[k], prod[k], cpu[k] = append(p50[k], m[4]), append(p99[k], m[6]), append(prod[k], m[7]), append(cpu[k], m[8])
		}
	}
	if len(order) == 0 {
		return "", fmt.Errorf("no latency run in the output")
	}
	b := "| rate | build | runs | p50 ms | p99 ms | the producers' own transactions, p99 ms | relay CPU s per 1k events |\n|---|---|---|---|---|---|---|\n"
	for _, k := range order {
		b += fmt.Sprintf("| %s | %s | %d | %s | %s | %s | %s |\n", k.rate, k.label, len(p50[k]), strings.Join(p50[k], ", "), strings.Join(p99[k], ", "),
			strings.Join(prod[k], ", "), strings.Join(cpu[k], ", "))
		if !strings.Contains(k.label, "tracing on") {
			plot.latency = append(plot.latency, fmt.Sprintf("%q %s %s", strings.Fields(k.rate)[0]+" ev/s", medianText(p50[k]), medianText(p99[k])))
		}
	}
	return b, nil
}

// medianText is the median of numbers written as text.
func medianText(xs []string) string {
	var fs []float64
	for _, x := range xs {
		if f, err := strconv.ParseFloat(x, 64); err == nil {
			fs = append(fs, f)
		}
	}
	if len(fs) == 0 {
		return "0"
	}
	slices.Sort(fs)
	return strconv.FormatFloat(fs[len(fs)/2], 'f', 2, 64)
}

// windowLine is one -window line of a latency run.
var windowLine = regexp.MustCompile(`window (\d+) \(.*\): commit → marked p50 ([\d.]+)\s+p95 ([\d.]+)\s+p99 ([\d.]+)\s+max ([\d.]+) ms \((\d+) events\); producer tx p99 ([\d.]+) max ([\d.]+) ms`)

// renderHeld gives the held-snapshot run per window, and the last window's
// p99 against the first's.
func renderHeld(outs []string, _ *plotData) (string, error) {
	b := "| window | p50 ms | p99 ms | max ms | events | the producers' slowest transaction, ms |\n|---|---|---|---|---|---|\n"
	var p99s []float64
	for _, l := range strings.Split(outs[0], "\n") {
		m := windowLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		b += fmt.Sprintf("| %s | %s | %s | %s | %s | %s |\n", m[1], m[2], m[4], m[5], m[6], m[8])
		f, _ := strconv.ParseFloat(m[4], 64)
		p99s = append(p99s, f)
	}
	if len(p99s) == 0 {
		return "", fmt.Errorf("no window line in the output")
	}
	last, first := p99s[len(p99s)-1], p99s[0]
	tick := "✘"
	if first > 0 && last <= 1.5*first && last <= 10 {
		tick = "✔"
	}
	return b + fmt.Sprintf("\nLast window's p99 against the first's: %.2f× (limit ≤ 1.5× and ≤ 10 ms) %s\n", last/max(first, 1e-9), tick), nil
}

// writePlot writes the plot's data beside plot.gp's expectations and draws
// it when gnuplot is installed.
func writePlot(dir, png string, plot plotData) {
	if len(plot.throughput) == 0 && len(plot.latency) == 0 {
		return
	}
	if len(plot.throughput) > 0 {
		check(os.WriteFile(filepath.Join(dir, "throughput.dat"), []byte(strings.Join(plot.throughput, "\n")+"\n"), 0o644))
	}
	if len(plot.latency) > 0 {
		check(os.WriteFile(filepath.Join(dir, "latency.dat"), []byte(strings.Join(plot.latency, "\n")+"\n"), 0o644))
	}
	gnuplot, err := exec.LookPath("gnuplot")
	if err != nil {
		fmt.Printf("report: gnuplot not installed, %s not drawn (the data is in %s)\n", png, dir)
		return
	}
	script, err := filepath.Abs("plot.gp")
	check(err)
	out, err := filepath.Abs(png)
	check(err)
	cmd := exec.Command(gnuplot, "-e", "out='"+out+"'", script)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, os.Stdout, os.Stderr
	check(cmd.Run())
	fmt.Printf("report: drew %s\n", png)
}
