// Package sdktest checks sluice under the real SDKs that users put it
// under, against httptest servers posing as their APIs: one SDK call makes
// no more attempts through sluice, with its defaults, than the SDK alone.
//
// It is a module of its own so that the SDKs never enter the library's
// go.mod. Run it with `cd sdktest && go test ./...`.
package sdktest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stripe/stripe-go/v82"

	"github.com/sluice-go/sluice"
)

// api is an httptest server that answers every request with status and
// headers, and counts the requests.
type api struct {
	*httptest.Server
	n atomic.Int32
}

func newAPI(t *testing.T, body string, status int, hdr ...string) *api {
	a := &api{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.n.Add(1)
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(a.Close)
	return a
}

// apiError is an error body as OpenAI, Anthropic and Stripe send them.
const apiError = `{"error":{"message":"test","type":"api_error"}}`

// clients returns the two ways one SDK call is made: the SDK alone (its
// default transport) and the SDK over sluice with sluice's defaults.
func clients(t *testing.T) map[string]*http.Client {
	tr, err := sluice.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*http.Client{"alone": {}, "sluice": {Transport: tr}}
}

// compare runs call once per client against a fresh api and checks that
// sluice makes as many attempts as the SDK alone, and want of them.
func compare(t *testing.T, want int32, body string, status int, hdr []string, call func(ctx context.Context, c *http.Client, url string) error) {
	t.Helper()
	got := map[string]int32{}
	for name, c := range clients(t) {
		a := newAPI(t, body, status, hdr...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		if err := call(ctx, c, a.URL); err == nil {
			t.Errorf("%s: no error from a %d", name, status)
		}
		cancel()
		got[name] = a.n.Load()
		t.Logf("%-6s %d attempts in %v", name, got[name], time.Since(start).Round(time.Millisecond))
	}
	if got["alone"] != want {
		t.Errorf("the SDK alone made %d attempts; this test expects %d", got["alone"], want)
	}
	if got["sluice"] != got["alone"] {
		t.Errorf("through sluice %d attempts, the SDK alone %d", got["sluice"], got["alone"])
	}
}

func openaiCall(ctx context.Context, c *http.Client, url string) error {
	client := openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("sk-test"), option.WithHTTPClient(c))
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	return err
}

func TestOpenAI429RetryAfterMs(t *testing.T) {
	compare(t, 3, apiError, http.StatusTooManyRequests, []string{"retry-after-ms", "20"}, openaiCall)
}

func TestOpenAI503ShouldRetryFalse(t *testing.T) {
	compare(t, 1, apiError, http.StatusServiceUnavailable, []string{"x-should-retry", "false"}, openaiCall)
}

func TestOpenAI500(t *testing.T) {
	compare(t, 3, apiError, http.StatusInternalServerError, []string{"retry-after-ms", "10"}, openaiCall)
}

func anthropicCall(ctx context.Context, c *http.Client, url string) error {
	client := anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey("sk-ant-test"), aoption.WithHTTPClient(c))
	_, err := client.Messages.New(ctx, anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 16,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	})
	return err
}

func TestAnthropic429RetryAfterMs(t *testing.T) {
	compare(t, 3, apiError, http.StatusTooManyRequests, []string{"retry-after-ms", "20"}, anthropicCall)
}

func TestAnthropic529ShouldRetryFalse(t *testing.T) {
	compare(t, 1, apiError, 529, []string{"x-should-retry", "false"}, anthropicCall)
}

func stripeCall(ctx context.Context, c *http.Client, url string) error {
	sc := stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:           stripe.String(url),
		HTTPClient:    c,
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
	_, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")})
	return err
}

// stripe-go retries a 500 only when its body is not a Stripe error (an
// *stripe.Error says "do not retry" itself): a proxy's page, here.
const proxyPage = "<html>502 upstream</html>"

// A POST carries stripe-go's Idempotency-Key, which sluice once took as
// licence to repeat it.
func TestStripe500ShouldRetryFalse(t *testing.T) {
	compare(t, 1, apiError, http.StatusInternalServerError, []string{"Stripe-Should-Retry", "false"}, stripeCall)
}

func TestStripe500(t *testing.T) {
	// stripe-go retries twice, about 0.5 s and 1 s apart.
	compare(t, 3, proxyPage, http.StatusInternalServerError, nil, stripeCall)
}

func TestStripe429LockTimeout(t *testing.T) {
	compare(t, 3, `{"error":{"code":"lock_timeout","type":"invalid_request_error"}}`, http.StatusTooManyRequests, nil, stripeCall)
}

func s3Call(ctx context.Context, c *http.Client, url string) error {
	client := s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		UsePathStyle: true,
		HTTPClient:   c,
		Credentials:  aws.AnonymousCredentials{},
		// The SDK's own retryer, waiting less between its attempts.
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) { o.MaxBackoff = 50 * time.Millisecond }),
	})
	_, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("b"), Key: aws.String("k")})
	return err
}

// s3Error is an error body of S3's REST-XML protocol.
const s3Error = `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>test</Message></Error>`

// aws-sdk-go-v2 makes three attempts of a call that a 503 answers, each
// marked Amz-Sdk-Request: a GET, which sluice would retry too.
func TestAWS503(t *testing.T) {
	compare(t, 3, s3Error, http.StatusServiceUnavailable, nil, s3Call)
}
