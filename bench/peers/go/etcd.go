package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

const etcdModule = "go.etcd.io/etcd/client/v3"

// newEtcdClient opens one client (one gRPC connection). Each lock contender
// gets its own client, as two processes would.
func newEtcdClient(ctx context.Context, endpoints []string) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("--endpoints is required (e.g. http://127.0.0.1:2379)")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Context: ctx})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v: %w", endpoints, err)
	}
	// Fail fast on a wrong URL instead of at the first sample.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Status(sctx, endpoints[0]); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("etcd %s not reachable: %w", endpoints[0], err)
	}
	return cli, nil
}

type lockResult struct {
	at  time.Time
	err error
}

// lockAsync starts m.Lock in a goroutine; the result channel gets the instant
// Lock returned.
func lockAsync(ctx context.Context, m *concurrency.Mutex) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		err := m.Lock(ctx)
		ch <- lockResult{at: time.Now(), err: err}
	}()
	return ch
}

// waitContenders polls until n keys exist under prefix: the waiter's Lock has
// then written its own key and is (or is about to be) watching for the
// holder's key to be deleted.
func waitContenders(ctx context.Context, cli *clientv3.Client, prefix string, n int64) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %d contenders under %s (have %d)", n, prefix, resp.Count)
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return err
		}
	}
}

// waiterSettle is how long the waiter is given, after its key appears, before
// the holder lets go. It must exceed etcd's watch resync period (100 ms,
// watchResyncPeriod in server/storage/mvcc/watchable_store.go): Lock's
// deletion watch starts at the revision of its preceding Get, which etcd
// treats as an "unsynced" watcher that is caught up only by a loop running
// every 100 ms. A delete that lands in that window is delivered at the next
// tick, so releasing 20-40 ms after the waiter arrived measured ~60 ms
// handoffs that say more about the waiter's arrival time than about the
// lock. 150 ms plus up to 100 ms of random jitter measures a waiter that is
// really blocked on a synced watch, which is the steady state of a lock
// queue.
const waiterSettle = 150 * time.Millisecond

type etcdFlags struct {
	endpoints string
	samples   int
	ttl       int
}

func parseEtcdFlags(name string, args []string, defSamples int, withTTL bool) etcdFlags {
	var f etcdFlags
	fs := newFlags(name)
	fs.StringVar(&f.endpoints, "endpoints", "", "comma-separated etcd client URLs (required)")
	fs.IntVar(&f.samples, "samples", defSamples, "number of samples")
	if withTTL {
		fs.IntVar(&f.ttl, "ttl", 15, "session (lease) TTL in seconds of the crashing holder")
	}
	_ = fs.Parse(args)
	return f
}

// runEtcdHandoff: A holds a concurrency.Mutex, B blocks in Lock (it watches
// for the deletion of A's key), A calls Unlock (a Delete of its key).
//
// Sample start: A's Unlock returned. Sample stop: B's Lock returned. After the
// delete event B's Lock also does one Get (to check its own session key still
// exists) before returning, so a sample is roughly watch delivery + one round
// trip. Because the watch event and A's Delete response race,
// params.from_unlock_call_ms also gives each handoff measured from the moment
// A *called* Unlock, which can never be negative.
func runEtcdHandoff(ctx context.Context, args []string) (*result, error) {
	f := parseEtcdFlags("etcd-handoff", args, 50, false)
	eps := splitEndpoints(f.endpoints)
	cliA, err := newEtcdClient(ctx, eps)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cliA.Close() }()
	cliB, err := newEtcdClient(ctx, eps)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cliB.Close() }()

	// Default session TTL (60 s): it plays no role in a voluntary handoff.
	sA, err := concurrency.NewSession(cliA)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sA.Close() }()
	sB, err := concurrency.NewSession(cliB)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sB.Close() }()

	prefix := "/leasehold-bench/etcd-handoff/" + runID()
	var samples, fromCall []float64
	for i := range f.samples {
		mA := concurrency.NewMutex(sA, prefix)
		mB := concurrency.NewMutex(sB, prefix)
		if err := mA.Lock(ctx); err != nil {
			return nil, fmt.Errorf("sample %d: A lock: %w", i, err)
		}
		bDone := lockAsync(ctx, mB)
		if err := waitContenders(ctx, cliA, prefix, 2); err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, err)
		}
		if err := sleepCtx(ctx, waiterSettle+rand.N(100*time.Millisecond)); err != nil {
			return nil, err
		}
		select {
		case r := <-bDone:
			return nil, fmt.Errorf("sample %d: B's Lock returned while A held the lock (err=%v)", i, r.err)
		default:
		}
		called := time.Now()
		if err := mA.Unlock(ctx); err != nil {
			return nil, fmt.Errorf("sample %d: A unlock: %w", i, err)
		}
		unlocked := time.Now()
		r, err := waitCtx(ctx, bDone, 30*time.Second, "B's Lock")
		if err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, err)
		}
		if r.err != nil {
			return nil, fmt.Errorf("sample %d: B lock: %w", i, r.err)
		}
		samples = append(samples, ms(r.at.Sub(unlocked)))
		fromCall = append(fromCall, ms(r.at.Sub(called)))
		if err := mB.Unlock(ctx); err != nil {
			return nil, fmt.Errorf("sample %d: B unlock: %w", i, err)
		}
	}
	logf("etcd-handoff: %d samples", len(samples))
	return &result{
		Peer:      "etcd-concurrency-mutex@" + moduleVersion(etcdModule),
		Scenario:  "handoff",
		SamplesMs: samples,
		Params: map[string]any{
			"endpoints":           eps,
			"samples":             f.samples,
			"session_ttl_s":       60,
			"prefix":              prefix,
			"etcd_client_version": moduleVersion(etcdModule),
			"transport":           "one clientv3.Client (gRPC connection) per contender",
			"sample_start":        "A's Mutex.Unlock returned",
			"sample_stop":         "B's Mutex.Lock returned",
			"release_phase":       "A unlocks 150-250 ms after B's key appeared, i.e. after etcd's 100 ms watch resync has synced B's deletion watch",
			"from_unlock_call_ms": fromCall,
			"clock":               "Go monotonic clock, one process",
		},
	}, nil
}

// runEtcdFailover: A's session (TTL --ttl) holds the Mutex, B blocks in Lock,
// then A "crashes": session.Orphan() stops the keepalive loop without revoking
// the lease, and A's client is closed, dropping its gRPC connection. That is
// exactly what etcd sees when a process is SIGKILLed: keepalives stop, the
// connection closes, and no LeaseRevoke is ever sent, so A's key lives until
// the lease expires on the server (etcd's lessor checks every 500 ms) and is
// deleted, which wakes B.
//
// The crash lands a uniform random time in [0, TTL/3) after B is waiting; the
// client sends a keepalive every TTL/3, so this places the crash at a random
// phase of the keepalive cycle and samples spread over about
// [2/3*TTL, TTL] + expiry-check granularity.
//
// Sample start: the crash instant (just before Orphan). Sample stop: B's Lock
// returned.
func runEtcdFailover(ctx context.Context, args []string) (*result, error) {
	f := parseEtcdFlags("etcd-failover", args, 5, true)
	if f.ttl < 2 {
		return nil, errors.New("--ttl must be at least 2 seconds")
	}
	eps := splitEndpoints(f.endpoints)
	ttl := time.Duration(f.ttl) * time.Second
	cliB, err := newEtcdClient(ctx, eps)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cliB.Close() }()
	sB, err := concurrency.NewSession(cliB)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sB.Close() }()

	prefix := "/leasehold-bench/etcd-failover/" + runID()
	var samples []float64
	var remaining []int64
	for i := range f.samples {
		sample, rem, err := func() (float64, int64, error) {
			cliA, err := newEtcdClient(ctx, eps)
			if err != nil {
				return 0, 0, err
			}
			defer func() { _ = cliA.Close() }()
			sA, err := concurrency.NewSession(cliA, concurrency.WithTTL(f.ttl))
			if err != nil {
				return 0, 0, err
			}
			mA := concurrency.NewMutex(sA, prefix)
			if err := mA.Lock(ctx); err != nil {
				return 0, 0, fmt.Errorf("A lock: %w", err)
			}
			mB := concurrency.NewMutex(sB, prefix)
			bDone := lockAsync(ctx, mB)
			if err := waitContenders(ctx, cliB, prefix, 2); err != nil {
				return 0, 0, err
			}
			if err := sleepCtx(ctx, waiterSettle+rand.N(ttl/3)); err != nil {
				return 0, 0, err
			}
			// Informational: how long A's lease had left just before the
			// crash (whole seconds, as etcd reports it).
			ttlResp, err := cliB.TimeToLive(ctx, sA.Lease())
			if err != nil {
				return 0, 0, err
			}
			crash := time.Now()
			sA.Orphan()
			_ = cliA.Close()
			r, err := waitCtx(ctx, bDone, 3*ttl+10*time.Second, "B's Lock after A's lease expiry")
			if err != nil {
				return 0, 0, err
			}
			if r.err != nil {
				return 0, 0, fmt.Errorf("B lock: %w", r.err)
			}
			sample := ms(r.at.Sub(crash))
			if err := mB.Unlock(ctx); err != nil {
				return 0, 0, fmt.Errorf("B unlock: %w", err)
			}
			return sample, ttlResp.TTL, nil
		}()
		if err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, err)
		}
		logf("etcd-failover sample %d/%d: %.3f ms (A's lease had %d s left at the crash)", i+1, f.samples, sample, rem)
		samples = append(samples, sample)
		remaining = append(remaining, rem)
	}
	return &result{
		Peer:      "etcd-concurrency-mutex@" + moduleVersion(etcdModule),
		Scenario:  "failover",
		SamplesMs: samples,
		Params: map[string]any{
			"endpoints":                eps,
			"samples":                  f.samples,
			"ttl_ms":                   ms(ttl),
			"keepalive_interval_ms":    ms(ttl / 3),
			"prefix":                   prefix,
			"etcd_client_version":      moduleVersion(etcdModule),
			"crash":                    "session.Orphan() (keepalives stop, lease not revoked) then client.Close() (connection dropped)",
			"crash_phase":              "uniform random pause in [150 ms, 150 ms + TTL/3) after B's key appeared",
			"sample_start":             "crash instant (immediately before Orphan)",
			"sample_stop":              "B's Mutex.Lock returned",
			"remaining_ttl_s_at_crash": remaining,
			"clock":                    "Go monotonic clock, one process",
		},
	}, nil
}

// runEtcdPut measures the floor: one Put of a value the size of a small Lease
// object, on one key, after a warm-up. Every Put is a full raft round
// (proposal, commit, apply) on the single member.
func runEtcdPut(ctx context.Context, args []string) (*result, error) {
	fs := newFlags("etcd-put")
	endpoints := fs.String("endpoints", "", "comma-separated etcd client URLs (required)")
	n := fs.Int("samples", 500, "number of timed Puts")
	warmup := fs.Int("warmup", 50, "untimed Puts first")
	size := fs.Int("value-bytes", 512, "value size (about one serialized Lease)")
	_ = fs.Parse(args)
	eps := splitEndpoints(*endpoints)
	cli, err := newEtcdClient(ctx, eps)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	key := "/leasehold-bench/etcd-put/" + runID()
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = cli.Delete(dctx, key)
	}()
	value := strings.Repeat("x", *size)
	samples := make([]float64, 0, *n)
	for i := range *warmup + *n {
		start := time.Now()
		if _, err := cli.Put(ctx, key, value); err != nil {
			return nil, fmt.Errorf("put %d: %w", i, err)
		}
		if i >= *warmup {
			samples = append(samples, ms(time.Since(start)))
		}
	}
	return &result{
		Peer:      "etcd-clientv3@" + moduleVersion(etcdModule),
		Scenario:  "put",
		SamplesMs: samples,
		Params: map[string]any{
			"endpoints":           eps,
			"samples":             *n,
			"warmup":              *warmup,
			"value_bytes":         *size,
			"etcd_client_version": moduleVersion(etcdModule),
			"sample_start":        "Put called",
			"sample_stop":         "Put returned",
		},
	}, nil
}
