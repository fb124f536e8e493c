// Command peers runs the peer side of `make bench`: the same lock scenarios
// that Leasehold is measured on, implemented with the libraries Leasehold is
// compared against (client-go leader election, etcd's concurrency.Mutex) plus
// two latency floors (one etcd Put, one Lease compare-and-swap through the
// apiserver).
//
// Every subcommand prints exactly one JSON object on stdout when it finishes:
//
//	{"peer": "...", "scenario": "...", "samples_ms": [...], "params": {...}}
//
// and human-readable progress on stderr. A non-zero exit status means the run
// failed and stdout is empty. See ../README.md for what each sample measures.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"
)

// result is the one JSON object a subcommand prints.
type result struct {
	Peer      string         `json:"peer"`
	Scenario  string         `json:"scenario"`
	SamplesMs []float64      `json:"samples_ms"`
	Params    map[string]any `json:"params"`
}

type subcommand struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) (*result, error)
}

var subcommands = []subcommand{
	{"clientgo-handoff", "client-go leaderelection: voluntary release (ReleaseOnCancel) to a waiting candidate", runClientGoHandoff},
	{"clientgo-failover", "client-go leaderelection: holder stops renewing without releasing; waiter takes over after expiry", runClientGoFailover},
	{"etcd-handoff", "etcd concurrency.Mutex: Unlock to a waiter blocked in Lock", runEtcdHandoff},
	{"etcd-failover", "etcd concurrency.Mutex: holder's session stops keepalives; waiter acquires after TTL expiry", runEtcdFailover},
	{"etcd-put", "floor: latency of one etcd Put", runEtcdPut},
	{"lease-cas", "floor: latency of one Lease update (compare-and-swap on resourceVersion) through the apiserver", runLeaseCAS},
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: peers <subcommand> [flags]\n\nsubcommands:\n")
	for _, s := range subcommands {
		fmt.Fprintf(os.Stderr, "  %-18s %s\n", s.name, s.summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun `peers <subcommand> -h` for its flags.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	// SIGINT/SIGTERM cancel the run; every wait below honours ctx, so the
	// program cleans up (releases, deletes its Lease) and exits instead of
	// leaving a half-finished sample behind.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	for _, s := range subcommands {
		if s.name != os.Args[1] {
			continue
		}
		start := time.Now()
		res, err := s.run(ctx, os.Args[2:])
		if err != nil {
			fmt.Fprintf(os.Stderr, "peers %s: error: %v\n", s.name, err)
			os.Exit(1)
		}
		res.Params["wall_s"] = round3(time.Since(start).Seconds())
		logf("%s: %s", s.name, summarize(res.SamplesMs))
		// One line of JSON; no HTML escaping, so "<lease>" stays readable.
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(os.Stderr, "peers %s: encoding result: %v\n", s.name, err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "peers: unknown subcommand %q\n\n", os.Args[1])
	usage()
	os.Exit(2)
}

// newFlags returns a FlagSet whose errors go to stderr and exit with status 2,
// so a bad invocation from the bench driver never prints JSON.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("peers "+name, flag.ExitOnError)
	fs.SetOutput(os.Stderr)
	return fs
}

// logf writes one progress line to stderr with a wall-clock prefix.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s peers: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// ms converts a duration to float milliseconds with microsecond resolution.
// Durations come from time.Time values carrying Go's monotonic clock reading,
// so they are immune to wall-clock steps.
func ms(d time.Duration) float64 {
	return round3(float64(d.Nanoseconds()) / 1e6)
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

func summarize(samples []float64) string {
	if len(samples) == 0 {
		return "no samples"
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	q := func(p float64) float64 { return s[int(math.Round(p*float64(len(s)-1)))] }
	return fmt.Sprintf("n=%d min=%.3fms p50=%.3fms mean=%.3fms p90=%.3fms max=%.3fms",
		len(s), s[0], q(0.5), sum/float64(len(s)), q(0.9), s[len(s)-1])
}

// moduleVersion reports the version of a dependency compiled into this
// binary, so the JSON names exactly what was measured.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				if m.Replace != nil {
					return m.Replace.Version
				}
				return m.Version
			}
		}
	}
	return "unknown"
}

// runID makes names unique per invocation (Lease names, etcd prefixes), so a
// run never inherits state from an earlier or concurrent one.
func runID() string {
	return fmt.Sprintf("%d", time.Now().UnixNano())
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// splitEndpoints accepts a comma-separated --endpoints value.
func splitEndpoints(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
