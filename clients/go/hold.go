// Package leasehold is a client of the Leasehold sidecar's lock API for the app in its pod.
//
// Acquire takes a session-bound hold: it lasts while the hold's stream stays open, and ends
// at once when the hold is released, or when the process dies and the kernel closes the
// connection. A background goroutine follows the stream; Held reports the hold only while
// the sidecar has not said it was lost and its deadline on CLOCK_BOOTTIME is ahead of the
// clock, so a frozen sidecar or a paused process is never told "held" late.
package leasehold

import (
	"context"
	"errors"
	"sync"
)

// Hold is one session-bound hold on a lock. Release it (or Close it) when done.
type Hold struct {
	client *Client
	lock   string
	grant  acquired

	// ctx is cancelled, with the reason as its cause, the moment the hold is known not
	// to be held any more.
	ctx  context.Context
	end  context.CancelCauseFunc
	stop context.CancelFunc // closes the stream's connection

	mu           sync.Mutex
	validUntilMs int64 // the deadline on CLOCK_BOOTTIME, ms since boot
	updated      chan struct{}
	releaseOnce  sync.Once
	releaseErr   error
}

// LostError is the cause of a hold's context once the hold is not held any more.
type LostError struct {
	Lock   string
	Reason string
}

func (e *LostError) Error() string { return "lock " + e.Lock + " is no longer held: " + e.Reason }

// Lock is the lock's name.
func (h *Hold) Lock() string { return h.lock }

// Token is the fencing token: present it to every resource the work writes.
func (h *Hold) Token() int64 { return h.grant.FencingToken }

// Handle is the owner handle naming this hold.
func (h *Hold) Handle() string { return h.grant.Handle }

// Held reports whether the hold may still be acted on: no `lost` or `released` word has
// arrived, the stream is open, and CLOCK_BOOTTIME is still before the last deadline the
// sidecar sent. When the clock cannot be read it answers false.
func (h *Hold) Held() bool {
	if h.ctx.Err() != nil {
		return false
	}
	now, err := boottimeNs()
	h.mu.Lock()
	deadline := h.validUntilMs
	h.mu.Unlock()
	return err == nil && heldAt(deadline, now)
}

// Lost is closed once the hold is not held any more: a `lost` or `released` event, the
// stream ending, a release, or the deadline passing with no renewal word.
func (h *Hold) Lost() <-chan struct{} { return h.ctx.Done() }

// Context is cancelled once the hold is not held any more; its cause is a *LostError.
// Run the work under it to stop when the lock is lost.
func (h *Hold) Context() context.Context { return h.ctx }

// Err is nil while Lost is open, and then the *LostError saying why.
func (h *Hold) Err() error {
	if h.ctx.Err() == nil {
		return nil
	}
	return context.Cause(h.ctx)
}

// Release gives the hold back with its owner handle and closes its stream. Safe to call
// more than once (later calls return the first result); a hold lost before it is
// released is released all the same, so the sidecar can hand the lock on.
func (h *Hold) Release() error {
	h.releaseOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.client.releaseTimeout())
		defer cancel()
		_, h.releaseErr = h.client.releaseHandle(ctx, h.lock, h.grant.Handle)
		h.finish("released by its owner")
		h.stop()
	})
	return h.releaseErr
}

// Close is Release, for defer and io.Closer.
func (h *Hold) Close() error { return h.Release() }

func (h *Hold) finish(reason string) {
	h.end(&LostError{Lock: h.lock, Reason: reason})
}

// heldAt is the "still held?" decision: the deadline (ms on CLOCK_BOOTTIME) is strictly
// after the clock's reading (ns on CLOCK_BOOTTIME).
func heldAt(validUntilMs, nowNs int64) bool {
	return validUntilMs > 0 && nowNs < validUntilMs*1_000_000
}

// IsLost reports whether err says a hold is not held any more.
func IsLost(err error) bool {
	var lost *LostError
	return errors.As(err, &lost)
}
