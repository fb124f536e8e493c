package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// client-go's documented defaults ("Core clients default this value to ...")
// as used by kube-controller-manager and kube-scheduler. The waiter polls every
// RetryPeriod stretched by up to JitterFactor (wait.JitterUntil), i.e. every
// 2 s to 4.4 s.
const (
	cgLeaseDuration = 15 * time.Second
	cgRenewDeadline = 10 * time.Second
	cgRetryPeriod   = 2 * time.Second
)

// cgPollWindow is the longest gap between two acquire attempts of a waiting
// candidate: RetryPeriod * (1 + JitterFactor).
var cgPollWindow = time.Duration(float64(cgRetryPeriod) * (1 + leaderelection.JitterFactor))

// phasePause is how long A keeps the lock after B has observed it, before A
// releases (handoff) or crashes (failover): uniform in [G, 2G) with G the
// longest poll gap. B's polls form a renewal process with gaps uniform in
// [2 s, 4.4 s]; a measurement must catch it at a random, *stationary* phase.
// Releasing within the first gap after B's first poll (a pause in [0, G))
// over-weights long residuals: a simulation gives a mean handoff of 1.87 s
// against the stationary 1.675 s. Skipping one gap first gives 1.678 s, at
// the cost of G (4.4 s) per sample.
func phasePause() time.Duration {
	return cgPollWindow + rand.N(cgPollWindow)
}

// instrumentedLock wraps client-go's LeaseLock to timestamp the writes that
// matter, at the moment the apiserver's answer arrives:
//   - every successful Create/Update naming us as holder is a renewal (or the
//     initial acquisition);
//   - a successful Update with an empty holder is the release that
//     ReleaseOnCancel performs (LeaderElector.release writes HolderIdentity="").
//
// Nothing else changes: the elector sees the same results and errors.
type instrumentedLock struct {
	rl.Interface
	mu        sync.Mutex
	lastRenew time.Time
	released  time.Time
}

func (l *instrumentedLock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, ler)
	if err == nil {
		l.mark(ler)
	}
	return err
}

func (l *instrumentedLock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, ler)
	if err == nil {
		l.mark(ler)
	}
	return err
}

func (l *instrumentedLock) mark(ler rl.LeaderElectionRecord) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if ler.HolderIdentity == "" {
		l.released = now
	} else if ler.HolderIdentity == l.Identity() {
		l.lastRenew = now
	}
}

func (l *instrumentedLock) times() (lastRenew, released time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastRenew, l.released
}

// candidate is one leader-election participant with its own clientset.
type candidate struct {
	id      string
	lock    *instrumentedLock
	started chan time.Time // OnStartedLeading, timestamped on entry
	leaders chan string    // OnNewLeader identities as this candidate observes them
	done    chan struct{}  // closed when LeaderElector.Run has returned
	cancel  context.CancelFunc
}

func startCandidate(ctx context.Context, cfg *rest.Config, ns, lease, id string, releaseOnCancel bool) (*candidate, error) {
	cs, err := newClientset(cfg, "leasehold-bench-peers/"+id, nil)
	if err != nil {
		return nil, err
	}
	c := &candidate{
		id: id,
		lock: &instrumentedLock{Interface: &rl.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: lease},
			Client:     cs.CoordinationV1(),
			LockConfig: rl.ResourceLockConfig{Identity: id},
		}},
		started: make(chan time.Time, 1),
		leaders: make(chan string, 64),
		done:    make(chan struct{}),
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            c.lock,
		LeaseDuration:   cgLeaseDuration,
		RenewDeadline:   cgRenewDeadline,
		RetryPeriod:     cgRetryPeriod,
		ReleaseOnCancel: releaseOnCancel,
		Name:            lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { c.started <- time.Now() },
			OnStoppedLeading: func() {},
			OnNewLeader: func(identity string) {
				select {
				case c.leaders <- identity:
				default:
				}
			},
		},
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	go func() {
		defer close(c.done)
		le.Run(runCtx)
	}()
	return c, nil
}

// stop cancels the candidate and waits until its Run has returned (which,
// with ReleaseOnCancel, is after the release write).
func (c *candidate) stop() {
	c.cancel()
	<-c.done
}

// waitObserves waits until c has seen `leader` as the Lease holder, i.e. c has
// made at least one acquire attempt, found the Lease held, and is now waiting.
func (c *candidate) waitObserves(ctx context.Context, leader string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		id, err := waitCtx(ctx, c.leaders, time.Until(deadline), c.id+" to observe "+leader+" as leader")
		if err != nil {
			return err
		}
		if id == leader {
			return nil
		}
	}
}

type clientGoFlags struct {
	kubeconfig, namespace string
	samples               int
}

func parseClientGoFlags(name string, args []string, defSamples int) clientGoFlags {
	var f clientGoFlags
	fs := newFlags(name)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig path (default: $KUBECONFIG rules)")
	fs.StringVar(&f.namespace, "namespace", "default", "namespace for the Lease (must exist)")
	fs.IntVar(&f.samples, "samples", defSamples, "number of samples")
	_ = fs.Parse(args)
	return f
}

func clientGoParams(f clientGoFlags, lease string, releaseOnCancel any) map[string]any {
	return map[string]any{
		"namespace":            f.namespace,
		"lease":                lease,
		"samples":              f.samples,
		"lease_duration_ms":    ms(cgLeaseDuration),
		"renew_deadline_ms":    ms(cgRenewDeadline),
		"retry_period_ms":      ms(cgRetryPeriod),
		"jitter_factor":        leaderelection.JitterFactor,
		"max_poll_gap_ms":      ms(cgPollWindow),
		"release_on_cancel":    releaseOnCancel,
		"lock":                 "resourcelock.LeaseLock (coordination.k8s.io/v1)",
		"transport":            "one clientset and one connection per candidate; client-go default QPS/burst and content type (protobuf)",
		"client_go_version":    moduleVersion("k8s.io/client-go"),
		"candidates":           "fresh pair per sample (identities <lease>-a-<i>, <lease>-b-<i>) on one Lease per run",
		"clock":                "Go monotonic clock, one process",
		"lease_deleted_at_end": true,
	}
}

func deleteLease(cfg *rest.Config, ns, name string) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = cs.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
	if err != nil {
		logf("warning: could not delete Lease %s/%s: %v", ns, name, err)
	}
}

// runClientGoHandoff measures a voluntary handoff between two client-go
// leader electors.
//
// Per sample: A starts and acquires the (free) Lease; B starts, makes its
// first attempt and observes A as leader (OnNewLeader); after a random pause
// (see phasePause) A's context is cancelled. With ReleaseOnCancel
// A's elector writes the Lease with an empty holder and then calls
// OnStoppedLeading.
//
// Sample start: the moment A's release Update (holderIdentity="") returned
// success — the instant the apiserver has committed an empty holder; this is
// also when OnStoppedLeading fires, microseconds later. Sample stop: entry of
// B's OnStartedLeading. B learns nothing from the release (client-go has no
// watch); it notices at its next jittered poll, so expect samples spread over
// 0 .. 4.4 s (mean about 1.7 s), not "up to 2 s".
func runClientGoHandoff(ctx context.Context, args []string) (*result, error) {
	f := parseClientGoFlags("clientgo-handoff", args, 10)
	cfg, err := loadRESTConfig(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	lease := "peers-cg-handoff-" + runID()
	defer deleteLease(cfg, f.namespace, lease)

	var samples []float64
	for i := range f.samples {
		a, err := startCandidate(ctx, cfg, f.namespace, lease, fmt.Sprintf("%s-a-%d", lease, i), true)
		if err != nil {
			return nil, err
		}
		if _, err := waitCtx(ctx, a.started, 3*cgLeaseDuration, "A to lead"); err != nil {
			a.stop()
			return nil, err
		}
		b, err := startCandidate(ctx, cfg, f.namespace, lease, fmt.Sprintf("%s-b-%d", lease, i), true)
		if err != nil {
			a.stop()
			return nil, err
		}
		sample, err := func() (float64, error) {
			defer b.stop() // B releases too, so the next sample's A acquires at once
			defer a.stop()
			if err := b.waitObserves(ctx, a.id, 30*time.Second); err != nil {
				return 0, err
			}
			if err := sleepCtx(ctx, phasePause()); err != nil {
				return 0, err
			}
			a.stop()
			_, released := a.lock.times()
			if released.IsZero() {
				return 0, errors.New("A's release write did not succeed")
			}
			bStarted, err := waitCtx(ctx, b.started, 3*cgLeaseDuration, "B to lead")
			if err != nil {
				return 0, err
			}
			return ms(bStarted.Sub(released)), nil
		}()
		if err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, err)
		}
		logf("clientgo-handoff sample %d/%d: %.3f ms", i+1, f.samples, sample)
		samples = append(samples, sample)
	}

	p := clientGoParams(f, lease, true)
	p["sample_start"] = "A's release Update (holderIdentity cleared) returned success; OnStoppedLeading follows immediately"
	p["sample_stop"] = "B's OnStartedLeading entered"
	p["release_phase"] = "A released after a uniform random pause in [max_poll_gap_ms, 2*max_poll_gap_ms) once B had observed A as leader (stationary phase of B's polling)"
	return &result{Peer: "client-go-leaderelection@" + moduleVersion("k8s.io/client-go"), Scenario: "handoff", SamplesMs: samples, Params: p}, nil
}

// runClientGoFailover measures takeover after the holder dies.
//
// The crash is simulated by cancelling A's context with ReleaseOnCancel=false:
// the renew loop stops at once (an in-flight renewal is aborted, exactly as a
// SIGKILL would abort it) and nothing else is written — the Lease keeps A's
// holderIdentity and last renewTime, which is the state a SIGKILLed process
// leaves behind. The program checks this by reading the Lease after the
// crash. The only difference from a real kill is that A's idle TCP
// connection stays open, which the apiserver and B cannot see.
//
// The crash lands after the same random pause as a handoff's release
// (phasePause), i.e. at a random phase of both A's 2 s renew cycle and B's
// 2–4.4 s poll cycle.
//
// Sample start: the crash instant (just before cancel). Sample stop: entry of
// B's OnStartedLeading. B judges expiry on its own clock from the moment it
// last saw the record change, so samples lie around LeaseDuration ±
// a poll gap (about 13–24 s with the defaults). params.from_last_renewal_ms
// gives the same takeovers measured from A's last successful renewal.
func runClientGoFailover(ctx context.Context, args []string) (*result, error) {
	f := parseClientGoFlags("clientgo-failover", args, 5)
	cfg, err := loadRESTConfig(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	lease := "peers-cg-failover-" + runID()
	defer deleteLease(cfg, f.namespace, lease)
	checker, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}

	var samples, fromRenew []float64
	for i := range f.samples {
		a, err := startCandidate(ctx, cfg, f.namespace, lease, fmt.Sprintf("%s-a-%d", lease, i), false)
		if err != nil {
			return nil, err
		}
		if _, err := waitCtx(ctx, a.started, 3*cgLeaseDuration, "A to lead"); err != nil {
			a.stop()
			return nil, err
		}
		b, err := startCandidate(ctx, cfg, f.namespace, lease, fmt.Sprintf("%s-b-%d", lease, i), true)
		if err != nil {
			a.stop()
			return nil, err
		}
		sample, sinceRenew, err := func() (float64, float64, error) {
			defer b.stop()
			defer a.stop()
			if err := b.waitObserves(ctx, a.id, 30*time.Second); err != nil {
				return 0, 0, err
			}
			if err := sleepCtx(ctx, phasePause()); err != nil {
				return 0, 0, err
			}
			crash := time.Now()
			a.stop()
			lastRenew, released := a.lock.times()
			if !released.IsZero() {
				return 0, 0, errors.New("A released the Lease; a crash must not")
			}
			l, err := checker.CoordinationV1().Leases(f.namespace).Get(ctx, lease, metav1.GetOptions{})
			if err != nil {
				return 0, 0, err
			}
			if h := l.Spec.HolderIdentity; h == nil || *h != a.id {
				// B cannot have taken over yet: the Lease is valid for 15 s
				// after A's last renewal, which was at most 2 s ago.
				return 0, 0, fmt.Errorf("after the crash the Lease names %v, want %s", h, a.id)
			}
			bStarted, err := waitCtx(ctx, b.started, 3*cgLeaseDuration, "B to take over")
			if err != nil {
				return 0, 0, err
			}
			return ms(bStarted.Sub(crash)), ms(bStarted.Sub(lastRenew)), nil
		}()
		if err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, err)
		}
		logf("clientgo-failover sample %d/%d: %.3f ms after crash (%.3f ms after last renewal)", i+1, f.samples, sample, sinceRenew)
		samples = append(samples, sample)
		fromRenew = append(fromRenew, sinceRenew)
	}

	p := clientGoParams(f, lease, "A: false (the crash); B: true (only releases after its sample)")
	p["crash"] = "cancel A's context with ReleaseOnCancel=false: renewals stop, no release is written (Lease verified to still name A)"
	p["crash_phase"] = "uniform random pause in [max_poll_gap_ms, 2*max_poll_gap_ms) after B observed A as leader"
	p["sample_start"] = "crash instant (immediately before cancelling A)"
	p["sample_stop"] = "B's OnStartedLeading entered"
	p["from_last_renewal_ms"] = fromRenew
	return &result{Peer: "client-go-leaderelection@" + moduleVersion("k8s.io/client-go"), Scenario: "failover", SamplesMs: samples, Params: p}, nil
}
