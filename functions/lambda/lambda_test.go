package lambda

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/go-cmp/cmp"
)

// echo reports what the handler received, so the test sees the mapping.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Seen", r.Method+" "+r.URL.RequestURI())
	w.Header().Add("X-Multi", "a")
	w.Header().Add("X-Multi", "b")
	w.WriteHeader(http.StatusTeapot)
	json.NewEncoder(w).Encode(map[string]string{
		"auth": r.Header.Get("Authorization"), "ctype": r.Header.Get("Content-Type"), "body": string(body),
	})
})

func TestInvoke(t *testing.T) {
	a := Adapter{Handler: echo, ScheduledPath: "/reapTick", SchedulerToken: "sched"}
	httpEvent := events.APIGatewayV2HTTPRequest{
		RawPath: "/getSession", RawQueryString: "id=42",
		Headers: map[string]string{"authorization": "Bearer tok", "content-type": "application/json"},
		Body:    base64.StdEncoding.EncodeToString([]byte(`{"x":1}`)), IsBase64Encoded: true,
	}
	httpEvent.RequestContext.HTTP.Method = "POST"
	httpPayload, _ := json.Marshal(httpEvent)
	tests := []struct {
		name     string
		payload  string
		wantSeen string
		wantBody map[string]string
		wantErr  bool
	}{
		{"HTTP API v2 request", string(httpPayload), "POST /getSession?id=42",
			map[string]string{"auth": "Bearer tok", "ctype": "application/json", "body": `{"x":1}`}, false},
		{"EventBridge schedule goes to the scheduler path", `{"source":"aws.events","detail-type":"Scheduled Event"}`, "POST /reapTick",
			map[string]string{"auth": "Bearer sched", "ctype": "application/json", "body": `{"source":"aws.events","detail-type":"Scheduled Event"}`}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := a.Invoke(context.Background(), json.RawMessage(tc.payload))
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusTeapot || res.Headers["X-Seen"] != tc.wantSeen || res.Headers["X-Multi"] != "a, b" {
				t.Errorf("response = %d %v", res.StatusCode, res.Headers)
			}
			var got map[string]string
			if err := json.Unmarshal([]byte(res.Body), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantBody, got); diff != "" {
				t.Errorf("handler saw (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := (Adapter{Handler: echo}).Invoke(context.Background(), json.RawMessage(`{}`)); err == nil {
		t.Error("a non-HTTP event without a scheduled path was accepted")
	}
}
