package sdktest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
)

// azureCall makes one call through an Azure SDK client as the generated
// clients (azblob, azcosmos, the arm* modules) build theirs: azcore's
// pipeline, whose retry policy tries a call up to 4 times on 408, 429,
// 500, 502, 503 and 504, and whose telemetry policy sends
// "User-Agent: azsdk-go-<module>/<version> ..." with every try. The
// retry delay is shortened so that the test is quick; the count of tries
// is the SDK's default.
func azureCall(ctx context.Context, c *http.Client, url string) error {
	client, err := azcore.NewClient("azblob.Client", "v1.8.3", runtime.PipelineOptions{}, &azcore.ClientOptions{
		Transport: c,
		Retry:     policy.RetryOptions{RetryDelay: 20 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	req, err := runtime.NewRequest(ctx, http.MethodGet, url+"/container/blob")
	if err != nil {
		return err
	}
	resp, err := client.Pipeline().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if !runtime.HasStatusCode(resp, http.StatusOK) {
		return runtime.NewResponseError(resp)
	}
	return nil
}

// azureError is an error body of Azure Storage.
const azureError = `<?xml version="1.0" encoding="utf-8"?><Error><Code>InternalError</Code><Message>test</Message></Error>`

// Azure's SDKs retry on their own, as the Stainless SDKs, stripe-go and
// aws-sdk-go-v2 do, and mark their tries only in their User-Agent: one
// GET answered 500 reaches the server 4 times, through sluice as without
// it (sluice retrying each of the SDK's tries would make it 12).
func TestAzureSDK500(t *testing.T) {
	compare(t, 4, azureError, http.StatusInternalServerError, nil, azureCall)
}
