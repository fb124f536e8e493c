package main

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// runLeaseCAS measures the floor of every Lease-based lock: one Update of a
// Lease through the apiserver carrying the resourceVersion we last read, i.e.
// a compare-and-swap that etcd applies in one transaction.
//
// Each Update sends the object returned by the previous Update (whose
// resourceVersion is the current one), exactly as a holder renewing on its
// fast path does; only the Update call is timed. Client-side rate limiting is
// disabled (QPS < 0), because with client-go's default 5 QPS the token bucket,
// not the apiserver, would set the pace of back-to-back updates. After the
// samples, an Update with a stale resourceVersion is sent to confirm the
// server rejects it with 409 Conflict, i.e. that what was timed really is a CAS.
func runLeaseCAS(ctx context.Context, args []string) (*result, error) {
	fs := newFlags("lease-cas")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig path (default: $KUBECONFIG rules)")
	namespace := fs.String("namespace", "default", "namespace for the Lease (must exist)")
	n := fs.Int("samples", 200, "number of timed updates")
	warmup := fs.Int("warmup", 20, "untimed updates first")
	_ = fs.Parse(args)

	cfg, err := loadRESTConfig(*kubeconfig)
	if err != nil {
		return nil, err
	}
	cs, err := newClientset(cfg, "leasehold-bench-peers/lease-cas", func(c *rest.Config) { c.QPS = -1 })
	if err != nil {
		return nil, err
	}
	leases := cs.CoordinationV1().Leases(*namespace)
	name := "peers-lease-cas-" + runID()
	holder := name + "-holder"
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: ptr.To[int32](15),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating Lease %s/%s: %w", *namespace, name, err)
	}
	defer deleteLease(cfg, *namespace, name)

	stale := lease.DeepCopy()
	samples := make([]float64, 0, *n)
	for i := range *warmup + *n {
		renew := metav1.NewMicroTime(time.Now())
		lease.Spec.RenewTime = &renew
		start := time.Now()
		updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
		elapsed := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("update %d: %w", i, err)
		}
		if i >= *warmup {
			samples = append(samples, ms(elapsed))
		}
		lease = updated
	}

	renew := metav1.NewMicroTime(time.Now())
	stale.Spec.RenewTime = &renew
	_, err = leases.Update(ctx, stale, metav1.UpdateOptions{})
	if !apierrors.IsConflict(err) {
		return nil, fmt.Errorf("update with stale resourceVersion: want 409 Conflict, got %v", err)
	}

	return &result{
		Peer:      "client-go@" + moduleVersion("k8s.io/client-go"),
		Scenario:  "lease-cas",
		SamplesMs: samples,
		Params: map[string]any{
			"namespace":         *namespace,
			"lease":             name,
			"samples":           *n,
			"warmup":            *warmup,
			"client_go_version": moduleVersion("k8s.io/client-go"),
			"content_type":      "application/vnd.kubernetes.protobuf (client-go default for built-in types)",
			"rate_limit":        "disabled (QPS<0)",
			"request":           "PUT leases/<name> with the resourceVersion returned by the previous update",
			"cas_verified":      "a stale resourceVersion was rejected with 409 Conflict",
			"sample_start":      "Update called",
			"sample_stop":       "Update returned",
		},
	}, nil
}
