// One piece of work under a Leasehold lock, held exactly as long as this process needs it.
//
// The acquire is session-bound: the sidecar keeps the lock while the response body stays
// open, and gives it up the moment it is closed — by resp.Body.Close(), or by the kernel
// when the process dies. Standard library only.
//
// Usage: go run . LOCK SECONDS LOGFILE  (appends "start TOKEN NS" and "end TOKEN NS")
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

type event struct {
	Event        string `json:"event"`
	FencingToken int64  `json:"fencingToken"`
	Handle       string `json:"handle"`
	RemainingMs  *int64 `json:"remainingMs"`
	Reason       string `json:"reason"`
}

// hold is what the sidecar last said about our hold.
type hold struct {
	mu         sync.Mutex
	token      int64
	validUntil time.Time // monotonic: act only before it
	ended      string
}

func (h *hold) held() (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended != "" {
		return false, h.ended
	}
	if !time.Now().Before(h.validUntil) {
		return false, "no word from the sidecar in time"
	}
	return true, ""
}

// follow reads the session's lines: `held` every second, `lost`/`released` at the end.
func (h *hold) follow(lines *bufio.Scanner) {
	for lines.Scan() {
		var e event
		if json.Unmarshal(lines.Bytes(), &e) != nil {
			continue // an empty keep-alive line
		}
		h.mu.Lock()
		if e.RemainingMs != nil {
			h.validUntil = time.Now().Add(time.Duration(*e.RemainingMs) * time.Millisecond)
		}
		if e.Event == "lost" || e.Event == "released" {
			h.ended = e.Event + ": " + e.Reason
		}
		h.mu.Unlock()
	}
	h.mu.Lock()
	if h.ended == "" {
		h.ended = "the session ended"
	}
	h.mu.Unlock()
}

func main() {
	if len(os.Args) != 4 {
		log.Fatal("usage: worker LOCK SECONDS LOGFILE")
	}
	lock, logfile := os.Args[1], os.Args[3]
	seconds, err := strconv.ParseFloat(os.Args[2], 64)
	if err != nil {
		log.Fatalf("SECONDS: %v", err)
	}
	sidecar := os.Getenv("LEASEHOLD_URL")
	if sidecar == "" {
		sidecar = "http://127.0.0.1:7070"
	}
	resp, err := http.Post(sidecar+"/v1/locks/"+lock+"/acquire", "application/json",
		strings.NewReader(`{"session": true, "waitSeconds": 60}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close() // the lock is ours until the body is closed
	lines := bufio.NewScanner(resp.Body)
	if !lines.Scan() {
		log.Fatalf("no answer: %v", lines.Err())
	}
	if resp.StatusCode != http.StatusOK {
		log.Fatalf("not acquired (%d): %s", resp.StatusCode, lines.Text())
	}
	var grant event
	if err := json.Unmarshal(lines.Bytes(), &grant); err != nil || grant.RemainingMs == nil {
		log.Fatalf("unexpected grant %q: %v", lines.Text(), err)
	}
	h := &hold{token: grant.FencingToken, validUntil: time.Now().Add(time.Duration(*grant.RemainingMs) * time.Millisecond)}
	go h.follow(lines)

	out, err := os.OpenFile(logfile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()
	fmt.Fprintf(out, "start %d %d\n", h.token, time.Now().UnixNano())
	for done := time.Now().Add(time.Duration(seconds * float64(time.Second))); time.Now().Before(done); {
		if ok, why := h.held(); !ok {
			log.Fatalf("lost the lock (%s); stopping", why)
		}
		time.Sleep(50 * time.Millisecond) // a step of the work: present h.token to what it writes
	}
	fmt.Fprintf(out, "end %d %d\n", h.token, time.Now().UnixNano())
	// Returning closes the body (deferred): the lock is released at once.
}
