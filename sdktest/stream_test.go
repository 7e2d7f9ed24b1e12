package sdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice"
)

// chatAPI poses as OpenAI's chat completions: a quick call answers after
// 50 ms; a streamed one sends its first chunk after 100 ms, then one every
// 100 ms for 3 s.
func chatAPI(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &req)
		if !req.Stream {
			time.Sleep(50 * time.Millisecond)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"c","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
			return
		}
		time.Sleep(100 * time.Millisecond)
		w.Header().Set("Content-Type", "text/event-stream")
		streamChunks(w, 30, 100*time.Millisecond)
	}))
	t.Cleanup(s.Close)
	return s
}

// streamChunks writes n chat completion chunks to w, every gap after the
// first, then the stream's end, flushing each.
func streamChunks(w http.ResponseWriter, n int, gap time.Duration) {
	fl := w.(http.Flusher)
	for i := range n {
		if i > 0 {
			time.Sleep(gap)
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		fl.Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

// streamScenario makes 20 quick calls at 10/s through c, then six streams
// at once and, 200 ms later, an Interactive quick call with a 1 s
// deadline; it returns the streams' first-token times, sorted, and the
// quick call's error.
func streamScenario(t *testing.T, c *http.Client, url string) ([]time.Duration, error) {
	client := openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("sk-test"), option.WithHTTPClient(c))
	params := openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	for range 20 {
		if _, err := client.Chat.Completions.New(context.Background(), params); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var mu sync.Mutex
	var first []time.Duration
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			t0 := time.Now()
			st := client.Chat.Completions.NewStreaming(context.Background(), params)
			defer st.Close()
			if st.Next() {
				mu.Lock()
				first = append(first, time.Since(t0))
				mu.Unlock()
			}
			for st.Next() {
			}
			if err := st.Err(); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(sluice.WithPriority(context.Background(), sluice.Interactive), time.Second)
	_, quickErr := client.Chat.Completions.New(ctx, params)
	cancel()
	wg.Wait()
	sort.Slice(first, func(i, j int) bool { return first[i] < first[j] })
	return first, quickErr
}

// TestOpenAIStreams: under openai-go, with sluice's defaults, six 3 s
// streams started after 20 quick calls get their first token within
// 150 ms of the SDK alone, and an Interactive quick call with a 1 s
// deadline is served meanwhile.
func TestOpenAIStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("a real-clock run of about 12 s")
	}
	alone, _ := streamScenario(t, &http.Client{}, chatAPI(t).URL)
	tr, err := sluice.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	through, quickErr := streamScenario(t, &http.Client{Transport: tr}, chatAPI(t).URL)
	t.Logf("first token: the SDK alone %v, through sluice %v", alone, through)
	if len(through) != 6 || len(alone) != 6 {
		t.Fatalf("%d and %d streams gave a first token, want 6", len(alone), len(through))
	}
	if worst := through[5]; worst > alone[5]+150*time.Millisecond {
		t.Errorf("through sluice the last first token came after %v, alone after %v", worst, alone[5])
	}
	if quickErr != nil {
		t.Errorf("Interactive quick call with a 1 s deadline: %v", quickErr)
	}
}

// refusingChatAPI poses as an OpenAI-compatible gateway that streams 20
// chat completions, then refuses every call after 50 ms: inBand, as
// LiteLLM does for an upstream's 429, with a 200 event stream whose first
// event is an error object and no event name; else with a 429 and no
// Retry-After. refused counts the calls refused.
func refusingChatAPI(t *testing.T, inBand bool, refused *atomic.Int32) *httptest.Server {
	var n atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(50 * time.Millisecond)
		refuse := n.Add(1) > 20
		if refuse && !inBand {
			refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		if refuse {
			refused.Add(1)
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"litellm.RateLimitError: upstream answered 429\",\"type\":null,\"param\":null,\"code\":\"429\"}}\n\ndata: [DONE]\n\n")
			return
		}
		streamChunks(w, 3, 0)
	}))
	t.Cleanup(s.Close)
	return s
}

// refusedStreams has 8 callers stream chat completions through c, with
// openai-go's retries off, for 3 s, against a gateway that refuses after
// 20 (see refusingChatAPI); it returns the calls the gateway refused and
// how many calls openai-go reported as failed (through sluice, these
// include the calls sluice refused).
func refusedStreams(t *testing.T, c *http.Client, inBand bool) (refused, failed int32) {
	var n, errs atomic.Int32
	url := refusingChatAPI(t, inBand, &n).URL
	client := openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("sk-test"), option.WithHTTPClient(c), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				st := client.Chat.Completions.NewStreaming(ctx, params)
				for st.Next() {
				}
				err := st.Err()
				st.Close()
				if err != nil && ctx.Err() == nil {
					errs.Add(1)
					time.Sleep(10 * time.Millisecond) // as a caller backs off
				}
			}
		})
	}
	wg.Wait()
	return n.Load(), errs.Load()
}

// pairRT is what users write by hand: x/time/rate's Wait, then an
// x/sync/semaphore slot held until the response's body is closed.
type pairRT struct {
	lim *rate.Limiter
	sem *semaphore.Weighted
}

func newPairRT(r float64, slots int64) *pairRT {
	return &pairRT{rate.NewLimiter(rate.Limit(r), 1), semaphore.NewWeighted(slots)}
}

func (p *pairRT) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := p.lim.Wait(req.Context()); err != nil {
		return nil, err
	}
	if err := p.sem.Acquire(req.Context(), 1); err != nil {
		return nil, err
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		p.sem.Release(1)
		return nil, err
	}
	resp.Body = &releaseBody{ReadCloser: resp.Body, release: sync.OnceFunc(func() { p.sem.Release(1) })}
	return resp, nil
}

// releaseBody releases its slot when it is closed.
type releaseBody struct {
	io.ReadCloser
	release func()
}

func (b *releaseBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// TestOpenAIStreamRefusedInBand: openai-go reads an OpenAI-compatible
// gateway's error object in a 200 stream as a failed call, and so does
// sluice: it holds back as it does for 429s, where a client that does not
// read the stream's first event keeps sending. The hand-made pair, set to
// 10/s, is logged beside them: it sends at its rate whatever it is told.
func TestOpenAIStreamRefusedInBand(t *testing.T) {
	if testing.Short() {
		t.Skip("a real-clock run of about 12 s")
	}
	through := func() *http.Client {
		tr, err := sluice.New(nil, sluice.WithRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return &http.Client{Transport: tr}
	}
	alone, aloneFailed := refusedStreams(t, &http.Client{}, true)
	inBand, _ := refusedStreams(t, through(), true)
	status, _ := refusedStreams(t, through(), false)
	// The hand-made pair reads nothing: it sends at the rate it was set to.
	pair, _ := refusedStreams(t, &http.Client{Transport: newPairRT(10, 8)}, true)
	t.Logf("calls the gateway refused in 3 s: in band, the SDK alone %d (%d failed), through sluice %d, through x/time/rate at 10/s + semaphore of 8 %d; with 429s, through sluice %d",
		alone, aloneFailed, inBand, pair, status)
	if aloneFailed == 0 || aloneFailed < alone*9/10 {
		t.Fatalf("openai-go reported %d of %d in-band refusals as failed calls: the gateway's error is not the SDK's", aloneFailed, alone)
	}
	if inBand > 2*status+16 {
		t.Errorf("through sluice %d in-band refusals, %d 429s: want the in-band error read as a 429 is", inBand, status)
	}
	if inBand*3 > alone {
		t.Errorf("through sluice %d in-band refusals, the SDK alone %d: want sluice to hold back", inBand, alone)
	}
}
