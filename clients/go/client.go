package leasehold

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// The API paths this client uses (checked against docs/sidecar-api.yaml by a test).
const (
	pathAcquire       = "/v1/locks/{name}/acquire"
	pathReleaseHandle = "/v1/locks/{name}/holds/{handle}/release"
)

// DefaultURL is where the sidecar listens when LEASEHOLD_URL is unset.
const DefaultURL = "http://127.0.0.1:7070"

// DefaultWait is how long Acquire waits for the grant when neither WithWait nor the
// context's deadline says otherwise (the sidecar's own default).
const DefaultWait = 30 * time.Second

// maxWait is the longest wait the sidecar accepts.
const maxWait = 3600 * time.Second

// Client talks to the sidecar of this pod.
type Client struct {
	// BaseURL is the sidecar's lock API, such as http://127.0.0.1:7070.
	BaseURL string
	// HTTP sends the requests; it must not time out whole requests (a session's stream
	// lasts as long as the hold). Nil means a client of its own.
	HTTP *http.Client
}

// New is a client of the sidecar at $LEASEHOLD_URL (set in every app container), or at
// DefaultURL.
func New() *Client {
	base := os.Getenv("LEASEHOLD_URL")
	if base == "" {
		base = DefaultURL
	}
	return &Client{BaseURL: strings.TrimRight(base, "/")}
}

// Option changes one acquire.
type Option func(*acquireRequest)

// WithWait sets how long the sidecar waits for the grant (0 is a try-lock that still gives
// the grant one second to arrive). Default: until the context's deadline, or DefaultWait.
func WithWait(wait time.Duration) Option {
	return func(r *acquireRequest) { r.WaitSeconds = seconds(wait) }
}

type acquireRequest struct {
	WaitSeconds float64 `json:"waitSeconds"`
	Session     bool    `json:"session"`
}

// acquired is the grant, the stream's first line.
type acquired struct {
	Lock                 string  `json:"lock"`
	FencingToken         int64   `json:"fencingToken"`
	Holder               string  `json:"holder"`
	ExpiresAt            string  `json:"expiresAt"`
	LeaseDurationSeconds int64   `json:"leaseDurationSeconds"`
	RemainingMs          int64   `json:"remainingMs"`
	ValidUntilBoottimeMs int64   `json:"validUntilBoottimeMs"`
	Handle               string  `json:"handle"`
	Session              bool    `json:"session"`
	TTLSeconds           float64 `json:"ttlSeconds"`
}

type released struct {
	Lock     string `json:"lock"`
	Released bool   `json:"released"`
	WasHeld  bool   `json:"wasHeld"`
	Reason   string `json:"reason"`
}

func seconds(d time.Duration) float64 {
	return math.Max(0, math.Floor(d.Seconds()*1000)/1000)
}

// waitFor is the waitSeconds to send: the option's, else what the context's deadline
// leaves, else the default; never more than the sidecar accepts.
func waitFor(option *float64, deadline time.Time, hasDeadline bool, now time.Time) float64 {
	switch {
	case option != nil:
		return math.Min(*option, maxWait.Seconds())
	case hasDeadline:
		return math.Min(seconds(deadline.Sub(now)), maxWait.Seconds())
	default:
		return DefaultWait.Seconds()
	}
}

// Acquire waits for lock and takes a session-bound hold on it. ctx bounds the wait only:
// cancelling it while waiting leaves the queue; once granted, the hold lasts until
// Release (or the process ends), whatever becomes of ctx.
func (c *Client) Acquire(ctx context.Context, lock string, options ...Option) (*Hold, error) {
	request := acquireRequest{WaitSeconds: -1, Session: true}
	for _, option := range options {
		option(&request)
	}
	var chosen *float64
	if request.WaitSeconds >= 0 {
		chosen = &request.WaitSeconds
	}
	deadline, hasDeadline := ctx.Deadline()
	request.WaitSeconds = waitFor(chosen, deadline, hasDeadline, time.Now())
	body, err := json.Marshal(request)
	if err != nil {
		return nil, fmt.Errorf("failed to encode the acquire of lock %s: %w", lock, err)
	}

	// The stream outlives ctx: it gets a context of its own, cancelled by ctx only until
	// the grant has arrived.
	streamCtx, closeStream := context.WithCancel(context.Background())
	stopWaiting := context.AfterFunc(ctx, closeStream)
	defer stopWaiting()
	req, err := http.NewRequestWithContext(streamCtx, http.MethodPost, c.url(pathAcquire, lock, ""), bytes.NewReader(body))
	if err != nil {
		closeStream()
		return nil, fmt.Errorf("failed to build the acquire of lock %s: %w", lock, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		closeStream()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("failed to acquire lock %s: %w", lock, context.Cause(ctx))
		}
		return nil, fmt.Errorf("failed to acquire lock %s: %w", lock, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer closeStream()
		defer resp.Body.Close()
		return nil, apiError(lock, resp)
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 0, 4096), 1<<20)
	var grant acquired
	if !lines.Scan() {
		resp.Body.Close()
		closeStream()
		return nil, fmt.Errorf("failed to acquire lock %s: the stream ended before the grant: %v", lock, lines.Err())
	}
	if err := json.Unmarshal(lines.Bytes(), &grant); err != nil || grant.Handle == "" {
		resp.Body.Close()
		closeStream()
		return nil, fmt.Errorf("failed to acquire lock %s: unexpected grant %q", lock, lines.Text())
	}
	if !stopWaiting() && ctx.Err() != nil {
		// ctx ended just as the grant arrived: the stream is closing, so give it back.
		resp.Body.Close()
		_, _ = c.releaseHandle(context.Background(), lock, grant.Handle)
		return nil, fmt.Errorf("failed to acquire lock %s: %w", lock, context.Cause(ctx))
	}
	held, end := context.WithCancelCause(context.Background())
	h := &Hold{
		client: c, lock: lock, grant: grant, ctx: held, end: end, stop: closeStream,
		validUntilMs: grant.ValidUntilBoottimeMs, updated: make(chan struct{}, 1),
	}
	go h.follow(lines, resp.Body)
	go h.watchDeadline()
	return h, nil
}

func (c *Client) releaseHandle(ctx context.Context, lock, handle string) (released, error) {
	var out released
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(pathReleaseHandle, lock, handle), nil)
	if err != nil {
		return out, fmt.Errorf("failed to build the release of lock %s: %w", lock, err)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return out, fmt.Errorf("failed to release lock %s: %w", lock, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out, apiError(lock, resp)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("failed to read the release of lock %s: %w", lock, err)
	}
	return out, nil
}

func (c *Client) url(path, lock, handle string) string {
	path = strings.ReplaceAll(path, "{name}", url.PathEscape(lock))
	path = strings.ReplaceAll(path, "{handle}", url.PathEscape(handle))
	return strings.TrimRight(c.BaseURL, "/") + path
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) releaseTimeout() time.Duration { return 30 * time.Second }

// apiError reads an error answer: {"error": {"code", "message"}}.
func apiError(lock string, resp *http.Response) error {
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e := &Error{Lock: lock, Status: resp.StatusCode}
	if json.Unmarshal(text, &body) == nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
	} else {
		e.Message = strings.TrimSpace(string(text))
	}
	return e
}
