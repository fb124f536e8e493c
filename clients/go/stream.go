package leasehold

import (
	"bufio"
	"encoding/json"
	"io"
	"time"
)

// sessionEvent is one line of a session-bound acquire's stream after the grant.
type sessionEvent struct {
	Event                string `json:"event"`
	FencingToken         int64  `json:"fencingToken"`
	RemainingMs          *int64 `json:"remainingMs"`
	ValidUntilBoottimeMs *int64 `json:"validUntilBoottimeMs"`
	Error                string `json:"error"`
	Reason               string `json:"reason"`
	WasHeld              *bool  `json:"wasHeld"`
	Missed               int64  `json:"missed"`
}

// step is what one stream line means for the hold: a new deadline (0: unchanged) and,
// when the hold ended, why.
func step(e sessionEvent) (validUntilMs int64, ended string) {
	switch e.Event {
	case "lost":
		return 0, "lost: " + orEvent(e.Reason, e.Event)
	case "released":
		return 0, "released: " + orEvent(e.Reason, e.Event)
	}
	if e.ValidUntilBoottimeMs != nil {
		return *e.ValidUntilBoottimeMs, ""
	}
	return 0, ""
}

func orEvent(reason, event string) string {
	if reason == "" {
		return event
	}
	return reason
}

// follow reads the stream until it ends, moving the deadline forward and ending the hold
// on `lost`, `released`, or the stream closing.
func (h *Hold) follow(lines *bufio.Scanner, body io.Closer) {
	defer body.Close()
	for lines.Scan() {
		if len(lines.Bytes()) == 0 {
			continue // a keep-alive
		}
		var e sessionEvent
		if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
			h.finish("unreadable line from the sidecar: " + err.Error())
			return
		}
		deadline, ended := step(e)
		if ended != "" {
			h.finish(ended)
			return
		}
		if deadline != 0 {
			h.mu.Lock()
			h.validUntilMs = deadline
			h.mu.Unlock()
			select {
			case h.updated <- struct{}{}:
			default:
			}
		}
	}
	reason := "the session stream ended"
	if err := lines.Err(); err != nil {
		reason += ": " + err.Error()
	}
	h.finish(reason)
}

// watchDeadline ends the hold when CLOCK_BOOTTIME passes the deadline with no renewal
// word, so Lost fires even when the sidecar falls silent.
func (h *Hold) watchDeadline() {
	for {
		now, err := boottimeNs()
		if err != nil {
			h.finish("cannot read CLOCK_BOOTTIME: " + err.Error())
			return
		}
		h.mu.Lock()
		deadline := h.validUntilMs
		h.mu.Unlock()
		if !heldAt(deadline, now) {
			h.finish("its deadline passed with no renewal word from the sidecar")
			return
		}
		timer := time.NewTimer(time.Duration(deadline*1_000_000-now) + time.Millisecond)
		select {
		case <-h.ctx.Done():
			timer.Stop()
			return
		case <-h.updated:
			timer.Stop()
		case <-timer.C:
		}
	}
}
