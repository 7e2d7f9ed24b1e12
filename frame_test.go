package sluice

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// sseBase answers every request with a 200 event stream whose body is
// stream, its headers 200 ms after the request.
type sseBase struct{ stream string }

func (b sseBase) RoundTrip(req *http.Request) (*http.Response, error) {
	time.Sleep(200 * time.Millisecond)
	return &http.Response{StatusCode: 200, Request: req,
		Header: http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}},
		Body:   io.NopCloser(strings.NewReader(b.stream))}, nil
}

const (
	// Anthropic's error events, as its streaming API sends them after a
	// 200's headers.
	sseRateLimited = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"Number of request tokens has exceeded your per-minute rate limit\"}}\n\n"
	sseOverloaded  = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	sseFine        = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\"}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\"}}\n\n"
)

// OpenAI-compatible servers' errors after a 200's headers, with no event
// name: LiteLLM's for an upstream 429, vLLM's when its engine is full,
// OpenRouter's chunk when the provider behind it gave out.
const (
	sseLiteLLM429    = "data: {\"error\":{\"message\":\"litellm.RateLimitError: upstream said 429\",\"type\":null,\"param\":null,\"code\":\"429\"}}\n\ndata: [DONE]\n\n"
	sseVLLMQueueFull = "data: {\"error\":{\"object\":\"error\",\"message\":\"The engine is full; try again later.\",\"type\":\"ServiceUnavailableError\",\"param\":null,\"code\":503}}\n\ndata: [DONE]\n\n"
	sseOpenRouter502 = "data: {\"id\":\"gen-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"error\":{\"code\":502,\"message\":\"Worker local total request limit reached (33/32)\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\ndata: [DONE]\n\n"
	sseOpenAIFine    = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"rate limit\"}}]}\n\ndata: {\"error\":{\"code\":429}}\n\n"
)

// TestStreamErrorFrame: a stream whose first event is an error frame about
// a rate limit is fed back as a refusal (the lane's rate is cut), one about
// overload as an overload (the in-flight limit is cut); a stream whose
// first event is not an error changes nothing, whatever comes after. The
// caller reads every stream as sent, in reads of any size.
func TestStreamErrorFrame(t *testing.T) {
	for _, c := range []struct {
		name, stream          string
		throttled, limitFalls bool
	}{
		{"rate limit", sseRateLimited, true, false},
		{"overloaded", sseOverloaded, false, true},
		{"error after the first event", sseFine, false, false},
		{"OpenAI-compatible rate limit", sseLiteLLM429, true, false},
		{"OpenAI-compatible overload", sseVLLMQueueFull, false, true},
		{"OpenAI-compatible gateway", sseOpenRouter502, false, true},
		{"OpenAI-compatible error after the first event", sseOpenAIFine, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := mustNew(t, sseBase{c.stream}, WithRate(100, time.Second), WithConcurrency(1, 32))
				for range 3 {
					req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://api.test/v1/messages", nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					var got strings.Builder
					buf := make([]byte, 7) // reads that split lines and frames
					for {
						n, err := resp.Body.Read(buf)
						got.Write(buf[:n])
						if err != nil {
							break
						}
					}
					resp.Body.Close()
					if got.String() != c.stream {
						t.Fatalf("the caller read %q, want the stream as sent", got.String())
					}
				}
				s, _ := tr.LaneStats("api.test")
				if got := s.Throttled > 0; got != c.throttled {
					t.Errorf("throttled %d, want any: %v", s.Throttled, c.throttled)
				}
				if c.throttled && !(s.Rate < 100) {
					t.Errorf("rate %v after a rate-limit error frame, want under 100", s.Rate)
				}
				// By Little's law 100/s at 200 ms keeps the limit near its
				// 32; an overload cuts it to 3/4 of what is in flight.
				if got := s.Limit <= 2; got != c.limitFalls {
					t.Errorf("limit %d of 32, want it cut: %v", s.Limit, c.limitFalls)
				}
			})
		})
	}
}

func TestFrameKind(t *testing.T) {
	for _, c := range []struct {
		ev   string
		want verdict.Kind
	}{
		{"event: error\ndata: {\"error\":{\"type\":\"rate_limit_error\"}}", verdict.Throttled},
		{"event:error\r\ndata: {\"error\":{\"code\":\"rate_limit_exceeded\"}}", verdict.Throttled},
		{"event: error\ndata: {\"error\":{\"type\":\"overloaded_error\"}}", verdict.Overloaded},
		{"event: error\ndata: {\"error\":{\"type\":\"invalid_request_error\"}}", verdict.Served},
		{"event: message_start\ndata: {\"rate_limit\":1}", verdict.Served},
		// OpenAI-compatible servers' errors: no event name, a top-level
		// "error" member, with words or the status it stands for.
		{"data: {\"error\":{\"type\":\"rate_limit_error\"}}", verdict.Throttled},
		{firstEvent(sseLiteLLM429), verdict.Throttled},
		{firstEvent(sseVLLMQueueFull), verdict.Overloaded},
		{firstEvent(sseOpenRouter502), verdict.Overloaded},
		{"data: {\"error\":{\"object\":\"error\",\"message\":\"context too long\",\"type\":\"BadRequestError\",\"code\":400}}", verdict.Served},
		{"data: {\"error\":{\"message\":\"quota exceeded\",\"code\":\"insufficient_quota\"}}", verdict.Served},
		{"data: {\"error\":\"Rate limit reached\"}", verdict.Throttled},
		{"event: error\ndata: {\"type\":\"error\",\"error\":{\"code\":529}}", verdict.Overloaded},
		{"event: error\ndata: {\"status\":\"429\"}", verdict.Throttled},
		// What is not an error member says nothing, whatever its words.
		{"data: {\"choices\":[{\"delta\":{\"content\":\"the rate limit is overloaded\"}}]}", verdict.Served},
		{"data: {\"id\":\"c\",\"error\":null,\"choices\":[]}", verdict.Served},
		{"data: {\"code\":429}", verdict.Served},
		{"data: {\"error\":{\"code\":4290}}", verdict.Served},
		{"data: {\"error\":{\"code\":\"42x\"}}", verdict.Served},
		{"data: {\"error\": {\"type\": \"rate_limit_error\"", verdict.Served}, // cut short: no JSON
		{"data: [DONE]", verdict.Served},
		{"", verdict.Served},
		// Lines that end with a CR alone, and a byte order mark.
		{"event: error\rdata: {\"error\":{\"type\":\"rate_limit_error\"}}", verdict.Throttled},
		{"\uFEFFevent: error\ndata: {\"error\":{\"type\":\"overloaded_error\"}}", verdict.Overloaded},
		// The field is "event", not one that begins with it.
		{"events: error\ndata: {\"type\":\"rate_limit_error\"}", verdict.Served},
	} {
		if got := frameKind([]byte(c.ev)); got != c.want {
			t.Errorf("frameKind(%q) = %v, want %v", c.ev, got, c.want)
		}
	}
}

// firstEvent returns stream's first event, without the blank line that
// ends it.
func firstEvent(stream string) string {
	ev, _, _ := strings.Cut(stream, "\n\n")
	return ev
}

// watchKind returns what a frameWatch on l finds in the first event of
// stream, read in chunks of the sizes given, then a byte at a time.
func watchKind(t *testing.T, l *lane, stream []byte, sizes []byte) verdict.Kind {
	t.Helper()
	w := &frameWatch{rc: &chunkReader{data: bytes.Clone(stream), sizes: sizes, err: io.EOF}, l: l, ctx: t.Context()}
	got, err := io.ReadAll(w)
	if err != nil || !bytes.Equal(got, stream) {
		t.Fatalf("read %d bytes (%v), want the %d sent", len(got), err, len(stream))
	}
	if !w.done || len(w.first) > 0 {
		t.Fatalf("the look did not end with the stream: done %v, %d bytes kept", w.done, len(w.first))
	}
	return w.kind
}

// TestFrameWatchFirstEvent: the watch finds the first event whatever ends
// its lines (LF, CRLF, CR, or a mix), however the reads split it, and
// passes over the blocks before it that carry no data, which are no event:
// a gateway's comments while the model starts, a stray blank line.
func TestFrameWatchFirstEvent(t *testing.T) {
	tr := mustNew(t, nopBase{})
	l := tr.lane("api.test")
	const (
		ev   = "event: error"
		data = `data: {"type":"error","error":{"type":"rate_limit_error"}}`
		next = "event: message_start\ndata: {}\n\n"
	)
	for _, c := range []struct {
		name, stream string
		want         verdict.Kind
	}{
		{"LF", ev + "\n" + data + "\n\n" + next, verdict.Throttled},
		{"CRLF", ev + "\r\n" + data + "\r\n\r\n" + next, verdict.Throttled},
		{"CR", ev + "\r" + data + "\r\r" + next, verdict.Throttled},
		{"LF then a CRLF blank line", ev + "\n" + data + "\n\r\n" + next, verdict.Throttled},
		{"CRLF then an LF blank line", ev + "\r\n" + data + "\r\n\n" + next, verdict.Throttled},
		{"CR then a CRLF blank line", ev + "\r" + data + "\r\r\n" + next, verdict.Throttled},
		{"no blank line before the end", ev + "\n" + data, verdict.Throttled},
		{"comments first", ": PROCESSING\n\n: PROCESSING\r\n\r\n" + ev + "\n" + data + "\n\n", verdict.Throttled},
		{"a blank line first", "\n\r\n" + ev + "\n" + data + "\n\n", verdict.Throttled},
		{"an event without data first", "event: ping\n\n" + ev + "\n" + data + "\n\n", verdict.Throttled},
		{"the error second", next + ev + "\n" + data + "\n\n", verdict.Served},
		{"a CRLF is one line end", "event: error\r\n" + data + "\n\n", verdict.Throttled},
		{"the error past the look", strings.Repeat(": x\n\n", firstFrameLimit/5) + ev + "\n" + data + "\n\n", verdict.Served},
	} {
		for _, sizes := range [][]byte{nil, {255, 255}, {7}, {3, 1, 2, 1}} {
			if got := watchKind(t, l, []byte(c.stream), sizes); got != c.want {
				t.Errorf("%s, reads of %v: %v, want %v", c.name, sizes, got, c.want)
			}
		}
	}
}

// FuzzFrameWatch: whatever a stream holds and however it is read, the
// caller reads it through the watch as sent, the look at its first event
// stops within firstFrameLimit bytes, and what it finds depends neither on
// how the reads split the stream nor, for a stream within the look, on
// which line ends it uses.
func FuzzFrameWatch(f *testing.F) {
	f.Add([]byte(sseRateLimited), []byte{5, 1, 200})
	f.Add([]byte(sseOverloaded), []byte{})
	f.Add([]byte(sseOpenRouter502), []byte{3, 17})
	f.Add([]byte("data: {\"error\":{\"error\":{\"status\":\"503\"}}}\n\n"), []byte{})
	f.Add([]byte(strings.Repeat("data: x\n", 1000)), []byte{255})
	f.Add([]byte(": c\r\n\r\nevent: error\rdata: overloaded\r\r"), []byte{1})
	tr, err := New(nopBase{})
	if err != nil {
		f.Fatal(err)
	}
	l := tr.lane("api.test")
	f.Fuzz(func(t *testing.T, data, sizes []byte) {
		k := watchKind(t, l, data, sizes)
		if whole := watchKind(t, l, data, []byte{255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255}); whole != k {
			t.Fatalf("%v read in chunks of %v, %v read whole", k, sizes, whole)
		}
		if len(data) >= firstFrameLimit {
			return
		}
		lf := bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
		if got := watchKind(t, l, lf, nil); got != k {
			t.Fatalf("%v, and %v with its line ends made LFs (%q)", k, got, lf)
		}
	})
}

// TestStreamRefusalReadAsAStatus: an unpaced lane whose server accepts 40
// calls and then refuses, each after 500 ms, from 64 callers, learns the
// same pace from a rate-limit error event as from a 429 without headers:
// the refused stream's slot is still held when its event is read, and is
// counted once among the attempts in flight, as the 429's is. The same
// holds for a stream held (HoldStream): refused, it is no served call
// when its body is done; and for a sub-limit the request names (a model),
// whose pace hears of the stream at its first event, not its headers; and
// for an OpenAI-compatible server's error, which names no event.
func TestStreamRefusalReadAsAStatus(t *testing.T) {
	plain := func(ctx context.Context) context.Context { return ctx }
	for _, c := range []struct {
		name, sub, refusal string
		ctx                func(context.Context) context.Context
	}{
		{"not held", "", sseRateLimited, plain},
		{"held", "", sseRateLimited, HoldStream},
		{"sub-limit", "model-a", sseRateLimited, func(ctx context.Context) context.Context { return WithSublimit(ctx, "model-a") }},
		{"OpenAI-compatible", "", sseLiteLLM429, plain},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, stream := refusedStreamRate(t, "", c.ctx, c.sub), refusedStreamRate(t, c.refusal, c.ctx, c.sub)
			if status <= 0 || math.Abs(stream-status) > 1e-9*status {
				t.Errorf("pace learned from a refused stream %v/s, from a 429 %v/s: want them equal, and set", stream, status)
			}
		})
	}
}

// refusedStreamRate returns the pace an unpaced lane (or its sub-limit
// sub, if not "") learns from a server that accepts 40 calls and then
// refuses, each after 500 ms, 64 callers sending through ctx (see
// TestStreamRefusalReadAsAStatus): with a 429 without headers if refusal
// is "", else with a stream whose first event is refusal, a rate-limit
// error.
func refusedStreamRate(t *testing.T, refusal string, ctx func(context.Context) context.Context, sub string) float64 {
	stream := refusal != ""
	var rate float64
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			refuse := n.Add(1) > 40
			time.Sleep(500 * time.Millisecond)
			switch {
			case stream && refuse:
				return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
					Body: io.NopCloser(strings.NewReader(refusal)), Request: req}, nil
			case stream:
				return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
					Body: io.NopCloser(strings.NewReader(sseFine)), Request: req}, nil
			case refuse:
				return &http.Response{StatusCode: 429, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("slow down")), Request: req}, nil
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for n.Load() <= 40 {
					get(ctx(t.Context()), tr, "")
				}
			})
		}
		wg.Wait()
		for _, ls := range tr.Stats().Lanes {
			if ls.Sublimit == sub {
				rate = ls.Rate
			}
		}
	})
	return rate
}
