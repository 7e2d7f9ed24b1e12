package sdktest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
)

// gcsCall reads a bucket's attributes through the Google Cloud Storage
// client for Go, over its JSON API: the client retries a GET answered
// 429, 500, 502, 503 or 504 on its own, and marks every try in its
// X-Goog-Api-Client header ("gccl-invocation-id/... gccl-attempt-count/2
// gl-go/... gccl/..."). The test caps its tries at 3 and shortens its
// backoff; by default it retries until the context ends.
func gcsCall(ctx context.Context, c *http.Client, url string) error {
	client, err := storage.NewClient(ctx, option.WithEndpoint(url+"/storage/v1/"), option.WithHTTPClient(c), option.WithoutAuthentication())
	if err != nil {
		return err
	}
	defer client.Close()
	client.SetRetry(storage.WithMaxAttempts(3), storage.WithBackoff(gax.Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond}))
	_, err = client.Bucket("b").Attrs(ctx)
	return err
}

// gcsError is an error body of the Cloud Storage JSON API.
const gcsError = `{"error":{"code":503,"message":"test","errors":[{"message":"test","domain":"global","reason":"backendError"}]}}`

// One GET answered 503 reaches the server as many times through sluice as
// without it: sluice leaves the retries to the client, which makes them.
func TestGCS503(t *testing.T) {
	compare(t, 3, gcsError, http.StatusServiceUnavailable, nil, gcsCall)
}
