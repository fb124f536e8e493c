package leasehold

import (
	"errors"
	"testing"
	"time"
)

func TestHeldOnlyStrictlyBeforeTheBoottimeDeadline(t *testing.T) {
	for _, c := range []struct {
		name         string
		validUntilMs int64
		nowNs        int64
		held         bool
	}{
		{"well before", 10_000, 5_000_000_000, true},
		{"one nanosecond before", 10_000, 9_999_999_999, true},
		{"at the deadline", 10_000, 10_000_000_000, false},
		{"after the deadline", 10_000, 12_000_000_000, false},
		{"no deadline known", 0, 1, false},
	} {
		if got := heldAt(c.validUntilMs, c.nowNs); got != c.held {
			t.Errorf("%s: heldAt(%d, %d) = %v, want %v", c.name, c.validUntilMs, c.nowNs, got, c.held)
		}
	}
}

func TestStreamLinesMoveTheDeadlineOrEndTheHold(t *testing.T) {
	ms := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		name     string
		event    sessionEvent
		deadline int64
		ended    string
	}{
		{"held moves the deadline", sessionEvent{Event: "held", RemainingMs: ms(900), ValidUntilBoottimeMs: ms(5_000)}, 5_000, ""},
		{"renew-late keeps the deadline it carries", sessionEvent{Event: "renew-late", ValidUntilBoottimeMs: ms(4_000)}, 4_000, ""},
		{"lost ends it", sessionEvent{Event: "lost", Reason: "revoked", ValidUntilBoottimeMs: ms(9_000)}, 0, "lost: revoked"},
		{"released ends it", sessionEvent{Event: "released", Reason: "released"}, 0, "released: released"},
		{"lost without a reason", sessionEvent{Event: "lost"}, 0, "lost: lost"},
		{"lagged changes nothing", sessionEvent{Event: "lagged", Missed: 3}, 0, ""},
	} {
		deadline, ended := step(c.event)
		if deadline != c.deadline || ended != c.ended {
			t.Errorf("%s: step = (%d, %q), want (%d, %q)", c.name, deadline, ended, c.deadline, c.ended)
		}
	}
}

func TestTheWaitComesFromTheOptionTheDeadlineOrTheDefault(t *testing.T) {
	now := time.Unix(1_000, 0)
	five, huge := 5.0, 10_000.0
	for _, c := range []struct {
		name        string
		option      *float64
		deadline    time.Time
		hasDeadline bool
		want        float64
	}{
		{"the option", &five, now.Add(time.Minute), true, 5},
		{"the option, capped", &huge, time.Time{}, false, 3600},
		{"the context's deadline", nil, now.Add(2500 * time.Millisecond), true, 2.5},
		{"a passed deadline is a try-lock", nil, now.Add(-time.Second), true, 0},
		{"the default", nil, time.Time{}, false, 30},
	} {
		if got := waitFor(c.option, c.deadline, c.hasDeadline, now); got != c.want {
			t.Errorf("%s: waitFor = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestErrorsMatchTheirCode(t *testing.T) {
	err := error(&Error{Lock: "orders", Status: 409, Code: CodeTimeout, Message: "not granted within 0s"})
	if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrUnknownLock) {
		t.Errorf("errors.Is does not tell %v by its code", err)
	}
	if got := err.Error(); got != "lock orders: not granted within 0s (409 timeout)" {
		t.Errorf("message %q", got)
	}
}
