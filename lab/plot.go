package lab

import (
	"errors"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// DefaultPlotPath is where `lab latency` draws its plot, relative to the
// current directory (os.TempDir() is used when it is not writable).
const DefaultPlotPath = "lab-output/latency-cdf.png"

// minPlotMs is the smallest latency the log axis shows (a log scale has no
// zero).
const minPlotMs = 0.01

// WriteLatencyPlot draws the latency CDF of each variant of r (all runs'
// samples together) on a log-scale x axis in milliseconds, with vertical
// lines at the floors' sums when measured (back to back, and at the test's
// pace), as a PNG at path (its directory is
// created). When path cannot be written it falls back to the same file name
// in os.TempDir(). It returns the path written.
func WriteLatencyPlot(path string, r *LatencyReport) (string, error) {
	p := plot.New()
	runs := "runs"
	if r.Runs == 1 {
		runs = "run"
	}
	p.Title.Text = fmt.Sprintf("outboxchat: send → shown latency, CDF (%d messages × %d %s per variant, one every %v)",
		r.Messages, r.Runs, runs, r.Interval)
	p.X.Label.Text = "latency, ms (log scale)"
	p.Y.Label.Text = "fraction of messages shown"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks125{}
	p.Y.Min, p.Y.Max = 0, 1
	p.Y.Tick.Marker = fractionTicks{}
	// Bottom right: CDFs are near 1 at large latencies, so that corner is
	// empty once the axis reaches far enough right (see X.Max below).
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(10)
	p.Legend.YOffs = vg.Points(10)
	p.Add(plotter.NewGrid())

	lo, hi, p35 := 1e9, 0.0, 0.0
	for i, v := range r.Variants {
		s := v.Samples()
		if len(s) == 0 {
			continue
		}
		pts := make(plotter.XYs, 0, 2*len(s)+1)
		first := max(msOf(s[0]), minPlotMs)
		pts = append(pts, plotter.XY{X: first, Y: 0})
		for j, d := range s {
			x := max(msOf(d), minPlotMs)
			// A step: up at each sample.
			pts = append(pts, plotter.XY{X: x, Y: float64(j) / float64(len(s))},
				plotter.XY{X: x, Y: float64(j+1) / float64(len(s))})
		}
		lo, hi = min(lo, first), max(hi, pts[len(pts)-1].X)
		p35 = max(p35, msOf(percentile(s, 0.35)))
		l, err := plotter.NewLine(pts)
		if err != nil {
			return "", fmt.Errorf("lab: plot %s: %w", v.Variant, err)
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(2)
		l.Dashes = plotutil.Dashes(i)
		p.Add(l)
		sum := v.Summary()
		p.Legend.Add(fmt.Sprintf("%s   p50 %s ms, n=%d", v.Variant, fmtMs(time.Duration(sum.P50Ms*float64(time.Millisecond))), sum.N), l)
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
			l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: 1}})
			if err != nil {
				return "", fmt.Errorf("lab: plot floors: %w", err)
			}
			l.Color = color.Gray{Y: 110}
			l.Width = vg.Points(1)
			l.Dashes = fl.dashes
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("%s: commit+ping+notify %s ms", fl.label, fmtMs(fl.sum)), l)
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	if hi == 0 {
		return "", errors.New("lab: plot: no samples")
	}
	// Whole decades, so the log axis always has labelled ticks; room on the
	// right for the legend below the slowest curve.
	p.X.Min, p.X.Max = decadeFloor(lo), decadeCeil(hi)
	for p35*20 > p.X.Max {
		p.X.Max *= 10
	}
	p.Legend.ThumbnailWidth = vg.Points(30)
	p.Legend.TextStyle.Font.Size = vg.Points(10)

	save := func(path string) error {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return p.Save(10*vg.Inch, 6*vg.Inch, path)
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

// logTicks125 marks a log axis with labelled ticks at 1, 2 and 5 of every
// decade and unlabelled ones at the other integers.
type logTicks125 struct{}

// Ticks implements plot.Ticker.
func (logTicks125) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for d := decadeFloor(lo); d <= hi*1.0001; d *= 10 {
		for k := 1; k <= 9; k++ {
			v := d * float64(k)
			if v < lo*0.9999 || v > hi*1.0001 {
				continue
			}
			t := plot.Tick{Value: v}
			if k == 1 || k == 2 || k == 5 {
				t.Label = strconv.FormatFloat(v, 'g', 6, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// fractionTicks marks 0…1 every 0.1, labelled every 0.2 and at 0.5, 0.9.
type fractionTicks struct{}

// Ticks implements plot.Ticker.
func (fractionTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for i := 0; i <= 10; i++ {
		v := float64(i) / 10
		t := plot.Tick{Value: v}
		if i%2 == 0 || i == 5 || i == 9 {
			t.Label = strconv.FormatFloat(v, 'f', 1, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}
