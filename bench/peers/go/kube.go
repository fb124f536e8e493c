package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// loadRESTConfig reads a kubeconfig: the explicit path if given, otherwise
// the usual $KUBECONFIG / ~/.kube/config rules.
func loadRESTConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %q: %w", path, err)
	}
	return cfg, nil
}

// newClientset builds a clientset with its own HTTP transport.
//
// client-go caches transports by TLS configuration, so two clientsets built
// from the same kubeconfig would share one HTTP/2 connection. Two leader
// election candidates are two processes in real life, each with its own
// connection; setting Dial opts out of the cache (transport.tlsConfigKey
// refuses to cache configs with a custom dialer) and gives each clientset a
// private connection. Everything else (rate limits, content type = protobuf
// for built-in types) stays at client-go's defaults unless the caller changes
// the returned config.
func newClientset(base *rest.Config, userAgent string, tweak func(*rest.Config)) (*kubernetes.Clientset, error) {
	cfg := rest.CopyConfig(base)
	cfg.UserAgent = userAgent
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	cfg.Dial = dialer.DialContext
	if tweak != nil {
		tweak(cfg)
	}
	return kubernetes.NewForConfig(cfg)
}

// waitCtx waits for a value on ch, for at most timeout, or until ctx ends.
func waitCtx[T any](ctx context.Context, ch <-chan T, timeout time.Duration, what string) (T, error) {
	var zero T
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case v := <-ch:
		return v, nil
	case <-t.C:
		return zero, fmt.Errorf("timed out after %s waiting for %s", timeout, what)
	case <-ctx.Done():
		return zero, fmt.Errorf("interrupted waiting for %s: %w", what, ctx.Err())
	}
}
