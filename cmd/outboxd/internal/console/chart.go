package console

import (
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"
)

// A chart is an inline SVG drawn on the server from the ring's samples:
// no script draws it, so it shows with JavaScript off. Its only text is
// numbers and the caller's fixed labels.

// point is one value of a line at a moment.
type point struct {
	at time.Time
	v  float64
}

// line is one polyline of a chart; class picks its colour in console.css.
type line struct {
	class, label string
	pts          []point
}

// rate is the per-second rate of the counter get between consecutive
// samples; a counter that went down (a restart) counts as no change.
func rate(samples []Sample, get func(Sample) float64) []point {
	var out []point
	for i := 1; i < len(samples); i++ {
		dt := samples[i].At.Sub(samples[i-1].At).Seconds()
		if dt <= 0 {
			continue
		}
		out = append(out, point{samples[i].At, max(get(samples[i])-get(samples[i-1]), 0) / dt})
	}
	return out
}

// level is the gauge get at each sample.
func level(samples []Sample, get func(Sample) float64) []point {
	out := make([]point, len(samples))
	for i, s := range samples {
		out[i] = point{s.At, get(s)}
	}
	return out
}

// The chart's size in SVG units.
const (
	chartW, chartH = 600.0, 120.0
	chartPad       = 14.0
)

// svgChart draws lines over the window ending at end, their highest value
// at the top, titled title (a fixed string) for screen readers.
func svgChart(title string, end time.Time, window time.Duration, lines ...line) template.HTML {
	top := 0.0
	for _, l := range lines {
		for _, p := range l.pts {
			top = max(top, p.v)
		}
	}
	scale := niceCeil(top)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %g %g" role="img" aria-label="%s">`, chartW, chartH, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%g" x2="%g" y2="%g"/>`, chartH-chartPad, chartW, chartH-chartPad)
	fmt.Fprintf(&b, `<text class="tick" x="2" y="10">%s</text>`, number(scale))
	fmt.Fprintf(&b, `<text class="tick" x="2" y="%g">−%d min</text>`, chartH-2, int(window.Round(time.Minute).Minutes()))
	fmt.Fprintf(&b, `<text class="tick" x="%g" y="%g" text-anchor="end">now</text>`, chartW-2, chartH-2)
	for _, l := range lines {
		if len(l.pts) == 0 {
			continue
		}
		fmt.Fprintf(&b, `<polyline class="%s" points="`, template.HTMLEscapeString(l.class))
		for _, p := range l.pts {
			x := chartW * (1 - end.Sub(p.at).Seconds()/window.Seconds())
			y := (chartH - chartPad) - (chartH-2*chartPad)*p.v/scale
			fmt.Fprintf(&b, "%.1f,%.1f ", max(x, 0), y)
		}
		fmt.Fprintf(&b, `"><title>%s</title></polyline>`, template.HTMLEscapeString(l.label))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // numbers and escaped fixed labels only
}

// niceCeil is the smallest of 1, 2, 5 × 10^k at or above v (1 at least),
// so the chart's top label is a round number.
func niceCeil(v float64) float64 {
	if !(v < 1e18) { // NaN, infinite or absurd: a flat chart rather than a long loop
		return 1
	}
	step := 1.0
	for {
		for _, m := range []float64{1, 2, 5} {
			if m*step >= v {
				return m * step
			}
		}
		step *= 10
	}
}

// number prints v without needless decimals.
func number(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
