package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one line of the results table.
type Row struct {
	Figure    string
	Value     string
	Reference string
	Ratio     string
	Target    string
}

// Result is what a phase measured: table rows and notes on how to read them.
type Result struct {
	Phase   string
	Rows    []Row
	Notes   []string
	Elapsed time.Duration
}

// PrintTable writes the rows as an aligned table.
func PrintTable(w io.Writer, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tREFERENCE (same run)\tRATIO\tTARGET (issue 9)")
	for _, r := range results {
		for _, row := range r.Rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", row.Figure, row.Value, dash(row.Reference), dash(row.Ratio), dash(row.Target))
		}
	}
	tw.Flush()
}

// PrintNotes writes each phase's notes under the table.
func PrintNotes(w io.Writer, results []Result) {
	for _, r := range results {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s: %s\n", r.Phase, n)
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// Section is one dated run for BENCHMARKS.md.
type Section struct {
	When     time.Time
	Mode     string // "smoke" or "full"
	Machine  Machine
	Command  string
	Sizes    []string
	Results  []Result
	GoBench  string // go test -bench output, or ""
	Profile  string // pprof -top of the throughput phase, or ""
	Duration time.Duration
	// LoadBefore and LoadAfter are the load averages at the start and the end.
	LoadBefore, LoadAfter string
}

// Markdown renders the section.
func (s Section) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — %s run\n\n", s.When.UTC().Format("2006-01-02 15:04 MST"), s.Mode)
	m := s.Machine
	fmt.Fprintf(&b, "- Machine: `%s`, %s, %d cores, %.1f GiB\n", m.Uname, m.CPU, m.Cores, m.MemGiB)
	fmt.Fprintf(&b, "- Go: %s\n", m.Go)
	fmt.Fprintf(&b, "- Commit: `%s`\n", m.Commit)
	fmt.Fprintf(&b, "- Command: `%s` (took %s)\n", s.Command, s.Duration.Round(time.Second))
	fmt.Fprintf(&b, "- Load average (1, 5, 15 min): %s before the run, %s after it (the bench itself keeps about %d cores busy; a high value before it means other work shared the CPU)\n",
		s.LoadBefore, s.LoadAfter, m.Cores)
	if len(s.Sizes) > 0 {
		fmt.Fprintf(&b, "- Sizes: %s\n", strings.Join(s.Sizes, "; "))
	}
	b.WriteString("\n| Figure | Value | Reference (same run) | Ratio | Target (issue 9) |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range s.Results {
		for _, row := range r.Rows {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", cell(row.Figure), cell(row.Value), cell(dash(row.Reference)), cell(dash(row.Ratio)), cell(dash(row.Target)))
		}
	}
	var notes []string
	for _, r := range s.Results {
		for _, n := range r.Notes {
			notes = append(notes, fmt.Sprintf("- %s: %s", r.Phase, n))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\nHow to read it:\n\n" + strings.Join(notes, "\n") + "\n")
	}
	if s.Profile != "" {
		b.WriteString("\n<details><summary>CPU profile of the throughput phase (pprof -top)</summary>\n\n```\n" + strings.TrimSpace(s.Profile) + "\n```\n</details>\n")
	}
	if s.GoBench != "" {
		b.WriteString("\n<details><summary>Go benchmarks</summary>\n\n```\n" + strings.TrimSpace(s.GoBench) + "\n```\n</details>\n")
	}
	return b.String()
}

func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

const benchmarksHeader = `# Benchmarks

Each section is one run of the bench suite (` + "`make bench`" + ` for the full run,
` + "`make bench-smoke`" + ` for the short one), appended by tests/cmd/bench with the machine,
the commit and the exact command. Every figure is measured in one run beside a
reference taken on the same server in the same run; the ratio compares them.
`

// AppendMarkdown appends the section to path, creating the file with a
// header when it does not exist.
func AppendMarkdown(path string, s Section) error {
	_, err := os.Stat(path)
	fresh := os.IsNotExist(err)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if fresh {
		if _, err := f.WriteString(benchmarksHeader); err != nil {
			f.Close()
			return err
		}
	}
	if _, err := f.WriteString("\n" + s.Markdown()); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Formatting helpers.

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
}

func pq(d Dist) string { return fmt.Sprintf("p50 %s, p99 %s", ms(d.P50), ms(d.P99)) }

func rate(n float64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return n / d.Seconds()
}

func num(f float64) string {
	switch {
	case f >= 100:
		return commas(int64(f + 0.5))
	case f >= 10:
		return fmt.Sprintf("%.1f", f)
	default:
		return fmt.Sprintf("%.2f", f)
	}
}

func commas(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + commas(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func ratio(a, b float64) string {
	if b == 0 {
		return ""
	}
	r := a / b
	switch {
	case r >= 10:
		return fmt.Sprintf("%.0f×", r)
	case r >= 0.1:
		return fmt.Sprintf("%.2f×", r)
	default:
		return fmt.Sprintf("%.2f%%", r*100)
	}
}

func bytesStr(b float64) string {
	switch {
	case b >= 1<<20 || b <= -(1<<20):
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 10<<10 || b <= -(10<<10):
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	default:
		return fmt.Sprintf("%.0f B", b)
	}
}

// target states one of issue 9's targets and whether this run met it.
func target(goal string, met bool) string {
	if met {
		return goal + ": met"
	}
	return goal + ": **not met**"
}
