package latency

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/font/liberation"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/outboxchat/outboxchat/lab/probe"
)

// The plot is drawn on gonum/plot's canvas (vg, vgimg) rather than with its
// plot package, whose init parses every Liberation font into a global cache:
// that made every `outboxchat serve` process (the same binary) read 3–4 MB
// of font data at start (the lab stays a subcommand of the one binary).
// The fonts are parsed here, on the first plot only.
var plotFonts = sync.OnceValue(func() *font.Cache { return font.NewCache(liberation.Collection()) })

// DefaultPlotPath is where `lab latency` draws its plot, relative to the
// current directory (os.TempDir() is used when it is not writable).
const DefaultPlotPath = "lab-output/latency-cdf.png"

// minPlotMs is the smallest latency the log axis shows (a log scale has no
// zero).
const minPlotMs = 0.01

// plotColors and plotDashes tell the variants apart (gonum plotutil's soft
// colours and first dash patterns).
var (
	plotColors = []color.Color{
		color.RGBA{241, 90, 96, 255}, color.RGBA{122, 195, 106, 255}, color.RGBA{90, 155, 212, 255},
		color.RGBA{250, 167, 91, 255}, color.RGBA{158, 103, 171, 255}, color.RGBA{206, 112, 88, 255},
	}
	plotDashes = [][]vg.Length{
		{}, {vg.Points(6), vg.Points(2)}, {vg.Points(2), vg.Points(2)}, {vg.Points(1), vg.Points(1)},
		{vg.Points(5), vg.Points(2), vg.Points(1), vg.Points(2)},
	}
)

// plotSeries is one line of the plot, in data coordinates (x ms, y 0…1).
type plotSeries struct {
	pts   [][2]float64
	style draw.LineStyle
	label string
}

// WritePlot draws the latency CDF of each variant of r (all runs'
// samples together) on a log-scale x axis in milliseconds, with vertical
// lines at the floors' sums when measured (back to back, and at the test's
// pace), as a 10×6 inch PNG at path (its directory is created). When path
// cannot be written it falls back to the same file name in os.TempDir(). It
// returns the path written. Not safe for concurrent use with itself on one
// path.
func WritePlot(path string, r *Report) (string, error) {
	var series []plotSeries
	lo, hi, p35 := 1e9, 0.0, 0.0
	for i, v := range r.Variants {
		s := v.Samples()
		if len(s) == 0 {
			continue
		}
		pts := make([][2]float64, 0, 2*len(s)+1)
		first := max(msOf(s[0]), minPlotMs)
		pts = append(pts, [2]float64{first, 0})
		for j, d := range s {
			x := max(msOf(d), minPlotMs)
			// A step: up at each sample.
			pts = append(pts, [2]float64{x, float64(j) / float64(len(s))}, [2]float64{x, float64(j+1) / float64(len(s))})
		}
		lo, hi = min(lo, first), max(hi, pts[len(pts)-1][0])
		p35 = max(p35, msOf(probe.Percentile(s, 0.35)))
		sum := v.Summary()
		series = append(series, plotSeries{pts: pts,
			style: draw.LineStyle{Color: plotColors[i%len(plotColors)], Width: vg.Points(2), Dashes: plotDashes[i%len(plotDashes)]},
			label: fmt.Sprintf("%s   p50 %s ms, n=%d", v.Variant, probe.FmtMs(time.Duration(sum.P50Ms*float64(time.Millisecond))), sum.N)})
	}
	if r.Floors != nil && r.Floors.Sum() > 0 {
		type floorLine struct {
			sum    time.Duration
			label  string
			dashes []vg.Length
		}
		lines := []floorLine{{r.Floors.Sum(), "floors back to back", []vg.Length{vg.Points(2), vg.Points(3)}}}
		if fp := r.Floors.Paced; fp != nil && fp.Sum() > 0 {
			lines = append(lines, floorLine{fp.Sum(), fmt.Sprintf("floors one per %v idle", fp.Pace), []vg.Length{vg.Points(6), vg.Points(3)}})
		}
		for _, fl := range lines {
			x := max(msOf(fl.sum), minPlotMs)
			series = append(series, plotSeries{pts: [][2]float64{{x, 0}, {x, 1}},
				style: draw.LineStyle{Color: color.Gray{Y: 110}, Width: vg.Points(1), Dashes: fl.dashes},
				label: fmt.Sprintf("%s: commit+ping+notify %s ms", fl.label, probe.FmtMs(fl.sum))})
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	if hi == 0 {
		return "", errors.New("lab: plot: no samples")
	}
	// Whole decades, so the log axis always has labelled ticks; room on the
	// right for the legend below the slowest curve.
	xmin, xmax := decadeFloor(lo), decadeCeil(hi)
	for p35*20 > xmax {
		xmax *= 10
	}
	title := fmt.Sprintf("outboxchat: send → shown latency, CDF (%d messages × %d %s per variant, one every %v)",
		r.Messages, r.Runs, map[bool]string{true: "run", false: "runs"}[r.Runs == 1], r.Interval)

	save := func(path string) error {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		img := vgimg.New(10*vg.Inch, 6*vg.Inch)
		drawCDF(draw.New(img), title, series, xmin, xmax)
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := save(path); err != nil {
		alt := filepath.Join(os.TempDir(), filepath.Base(path))
		if err2 := save(alt); err2 != nil {
			return "", fmt.Errorf("lab: save plot: %w", errors.Join(err, err2))
		}
		return alt, nil
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return path, nil
}

// drawCDF draws the axes (x log-scale in ms from xmin to xmax, y 0…1), a
// grid at the ticks, the series and their legend (bottom right) on c.
func drawCDF(c draw.Canvas, title string, series []plotSeries, xmin, xmax float64) {
	txt := func(size vg.Length, xa text.XAlignment, ya text.YAlignment) draw.TextStyle {
		return draw.TextStyle{Color: color.Black, Font: font.Font{Typeface: "Liberation", Variant: "Serif", Size: size},
			XAlign: xa, YAlign: ya, Handler: text.Plain{Fonts: plotFonts()}}
	}
	tick := txt(vg.Points(10), draw.XCenter, draw.YTop)
	// The data area: room for the title, the tick labels and axis labels.
	left, right := c.Min.X+vg.Points(56), c.Max.X-vg.Points(14)
	bottom, top := c.Min.Y+vg.Points(48), c.Max.Y-vg.Points(30)
	X := func(ms float64) vg.Length {
		f := (math.Log10(ms) - math.Log10(xmin)) / (math.Log10(xmax) - math.Log10(xmin))
		return left + vg.Length(f)*(right-left)
	}
	Y := func(y float64) vg.Length { return bottom + vg.Length(y)*(top-bottom) }
	grid := draw.LineStyle{Color: color.Gray{Y: 220}, Width: vg.Points(0.5)}
	axis := draw.LineStyle{Color: color.Black, Width: vg.Points(0.5)}

	for _, t := range logTicks125(xmin, xmax) {
		x := X(t.value)
		c.StrokeLine2(grid, x, bottom, x, top)
		n := vg.Points(3)
		if t.label != "" {
			n = vg.Points(6)
			c.FillText(tick, vg.Point{X: x, Y: bottom - vg.Points(8)}, t.label)
		}
		c.StrokeLine2(axis, x, bottom, x, bottom-n)
	}
	ytick := txt(vg.Points(10), draw.XRight, draw.YCenter)
	for _, t := range fractionTicks() {
		y := Y(t.value)
		c.StrokeLine2(grid, left, y, right, y)
		n := vg.Points(3)
		if t.label != "" {
			n = vg.Points(6)
			c.FillText(ytick, vg.Point{X: left - vg.Points(8), Y: y}, t.label)
		}
		c.StrokeLine2(axis, left, y, left-n, y)
	}
	c.StrokeLines(axis, []vg.Point{{X: left, Y: top}, {X: left, Y: bottom}, {X: right, Y: bottom}})
	c.FillText(txt(vg.Points(12), draw.XCenter, draw.YTop), vg.Point{X: (left + right) / 2, Y: c.Min.Y + vg.Points(22)}, "latency, ms (log scale)")
	ylabel := txt(vg.Points(12), draw.XCenter, draw.YBottom)
	ylabel.Rotation = math.Pi / 2
	c.FillText(ylabel, vg.Point{X: c.Min.X + vg.Points(14), Y: (bottom + top) / 2}, "fraction of messages shown")
	c.FillText(txt(vg.Points(12), draw.XCenter, draw.YTop), vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: c.Max.Y - vg.Points(8)}, title)

	area := draw.Crop(c, left-c.Min.X, right-c.Max.X, bottom-c.Min.Y, top-c.Max.Y)
	for _, s := range series {
		pts := make([]vg.Point, len(s.pts))
		for i, p := range s.pts {
			pts[i] = vg.Point{X: X(p[0]), Y: Y(p[1])}
		}
		area.StrokeLines(s.style, area.ClipLinesXY(pts)...)
	}
	// The legend, bottom right: CDFs are near 1 at large latencies, so that
	// corner is empty once the axis reaches far enough right.
	leg := txt(vg.Points(10), draw.XRight, draw.YCenter)
	var w vg.Length
	for _, s := range series {
		w = max(w, leg.Width(s.label))
	}
	x0, y1 := right-vg.Points(52)-w, bottom+vg.Points(4+14*float64(len(series)))
	c.FillPolygon(color.White, []vg.Point{{X: x0, Y: bottom + vg.Points(3)}, {X: right - vg.Points(3), Y: bottom + vg.Points(3)},
		{X: right - vg.Points(3), Y: y1}, {X: x0, Y: y1}})
	y := bottom + vg.Points(12)
	for i := len(series) - 1; i >= 0; i-- {
		s := series[i]
		x := right - vg.Points(10) - vg.Points(30)
		c.StrokeLine2(s.style, x, y, x+vg.Points(30), y)
		c.FillText(leg, vg.Point{X: x - vg.Points(6), Y: y}, s.label)
		y += vg.Points(14)
	}
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// decadeFloor returns the largest power of ten ≤ x (x > 0).
func decadeFloor(x float64) float64 {
	d := 1.0
	for d > x {
		d /= 10
	}
	for d*10 <= x {
		d *= 10
	}
	return d
}

// decadeCeil returns the smallest power of ten ≥ x (x > 0).
func decadeCeil(x float64) float64 {
	d := decadeFloor(x)
	if d < x {
		d *= 10
	}
	return d
}

// axisTick is one tick mark of an axis: its value and label ("" = none).
type axisTick struct {
	value float64
	label string
}

// logTicks125 marks a log axis from lo to hi with labelled ticks at 1, 2 and
// 5 of every decade and unlabelled ones at the other integers.
func logTicks125(lo, hi float64) []axisTick {
	var ticks []axisTick
	for d := decadeFloor(lo); d <= hi*1.0001; d *= 10 {
		for k := 1; k <= 9; k++ {
			v := d * float64(k)
			if v < lo*0.9999 || v > hi*1.0001 {
				continue
			}
			t := axisTick{value: v}
			if k == 1 || k == 2 || k == 5 {
				t.label = strconv.FormatFloat(v, 'g', 6, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// fractionTicks marks 0…1 every 0.1, labelled every 0.2 and at 0.5, 0.9.
func fractionTicks() []axisTick {
	var ticks []axisTick
	for i := 0; i <= 10; i++ {
		v := float64(i) / 10
		t := axisTick{value: v}
		if i%2 == 0 || i == 5 || i == 9 {
			t.label = strconv.FormatFloat(v, 'f', 1, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}
