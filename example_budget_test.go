package sluice_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
)

// An OpenAI account tier limits requests and tokens per minute; the token
// budget usually binds. Each call carries its estimated cost: the prompt's
// tokens plus max_tokens. OpenAI's x-ratelimit-*-tokens headers bring the
// "tokens" budget back to the server's count after every call.
func ExampleWithBudget_openAI() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ratelimit-limit-tokens", "30000")
		w.Header().Set("x-ratelimit-remaining-tokens", "28000")
		w.Header().Set("x-ratelimit-reset-tokens", "4s")
		fmt.Fprint(w, `{"usage": {"total_tokens": 1000}}`)
	}))
	defer api.Close()

	tr, err := sluice.New(nil,
		sluice.WithRate(500, time.Minute),
		sluice.WithBudget("tokens", 30000, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	const promptTokens, maxTokens = 800, 1200
	ctx := sluice.WithCost(context.Background(), "tokens", promptTokens+maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/chat/completions", strings.NewReader(`{}`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-tokens"))
	// Output: 200 28000
}

// A server that states no count of tokens (here a gateway in front of a
// model, without rate-limit headers) leaves the budget to sluice's own
// account of the estimates. Report brings it to what the call used, once
// the body says: the estimate took 2,000 tokens, the call used 1,000, and
// the other 1,000 go back to the budget.
func ExampleTransport_Report() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"usage": {"total_tokens": 1000}}`)
	}))
	defer api.Close()

	tr, err := sluice.New(nil, sluice.WithBudget("tokens", 30000, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	const promptTokens, maxTokens = 800, 1200
	ctx := sluice.WithCost(context.Background(), "tokens", promptTokens+maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/chat/completions", strings.NewReader(`{}`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		log.Fatal(err)
	}
	tr.Report(resp, "tokens", out.Usage.TotalTokens)
	fmt.Println(resp.StatusCode, out.Usage.TotalTokens)
	// Output: 200 1000
}

// Anthropic limits requests, input tokens and output tokens per minute,
// each on its own. A call draws on the input budget by its prompt and on
// the output budget by its max_tokens; the anthropic-ratelimit-*
// headers keep both in step with the server.
func ExampleWithBudget_anthropic() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("anthropic-ratelimit-input-tokens-remaining", "39000")
		w.Header().Set("anthropic-ratelimit-output-tokens-remaining", "7000")
		fmt.Fprint(w, `{}`)
	}))
	defer api.Close()

	tr, err := sluice.New(nil,
		sluice.WithRate(50, time.Minute),
		sluice.WithBudget("input-tokens", 40000, time.Minute),
		sluice.WithBudget("output-tokens", 8000, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	ctx := sluice.WithCost(context.Background(), "input-tokens", 1000)
	ctx = sluice.WithCost(ctx, "output-tokens", 1024)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/messages", strings.NewReader(`{}`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)

	// A call that asks for more output than the budget holds in a minute
	// can never be served: it is refused at once.
	ctx = sluice.WithCost(context.Background(), "output-tokens", 9000)
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/messages", strings.NewReader(`{}`))
	_, err = client.Do(req)
	fmt.Println(err != nil)
	// Output:
	// 200
	// true
}
