package probe

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of sorted
// samples, 0 when there are none.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(n))) - 1
	return sorted[min(max(i, 0), n-1)]
}

// Median returns the median of ds (mean of the middle two for an
// even count; 0 for none). ds is not modified.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// RoundMs converts d to milliseconds rounded to the microsecond.
func RoundMs(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// FmtMs formats d in milliseconds with two significant decimals below 10 ms.
func FmtMs(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

// FmtRange formats the min and max of ds over runs as "A to B ms" ("A ms"
// when they are equal once formatted).
func FmtRange(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	lo, hi := FmtMs(slices.Min(ds)), FmtMs(slices.Max(ds))
	if lo == hi {
		return lo + " ms"
	}
	return lo + " to " + hi + " ms"
}

// WriteColumns prints rows as left-aligned columns (the first column) and
// right-aligned ones (the others), two spaces apart.
func WriteColumns(w io.Writer, rows [][]string) {
	if len(rows) == 0 {
		return
	}
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}
